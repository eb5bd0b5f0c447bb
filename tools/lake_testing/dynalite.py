"""A real DynamoDB for tests: dynalite (npm ``dynalite@4.0.0``, LevelDB on disk).

Unlike moto it serialises conditional writes correctly under concurrency and
keeps its data across restarts, so races, fencing and durability can be proved.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import boto3

from lake_metasrv.engine.s3 import MANIFEST_TABLE_SCHEMA
from tools.lake_testing.servers import free_port

__all__ = ["Dynalite", "dynalite_cli"]

REPO = Path(__file__).resolve().parents[2]


def dynalite_cli() -> Path:
    cli = Path(
        os.environ.get("LAKE_DYNALITE_CLI", REPO / ".cache/node/node_modules/dynalite/cli.js")
    )
    if not cli.exists():
        raise RuntimeError(f"dynalite is not installed at {cli}: run tools/install_test_servers.sh")
    return cli


@dataclass
class Dynalite:
    """One dynalite process on 127.0.0.1 with its data under ``root``."""

    root: Path
    port: int = field(default_factory=free_port)
    region: str = "us-east-1"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL_DYNAMODB": self.endpoint, "AWS_REGION": self.region}

    def manifest_table(self) -> str:
        """A new, empty table for Lance's DynamoDB manifest store; its name."""
        name = f"manifests_{uuid.uuid4().hex[:8]}"
        client = boto3.client("dynamodb", endpoint_url=self.endpoint, region_name=self.region)
        client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **MANIFEST_TABLE_SCHEMA)
        client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2})
        return name

    def start(self, timeout_s: float = 30.0) -> Dynalite:
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is needed to run dynalite")
        data = self.root / "dynalite"
        data.mkdir(parents=True, exist_ok=True)
        with (self.root / "dynalite.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    node,
                    str(dynalite_cli()),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--path",
                    str(data),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dynalite exited {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError("dynalite did not start")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> Dynalite:
        self.stop()
        return self.start()
