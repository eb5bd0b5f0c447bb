"""Start and stop real ``lake meta`` and ``lake query`` processes.

Every process is started by this module, tracked by pid, and stopped by pid
in teardown; nothing is ever killed by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = [
    "LakeProcess",
    "free_port",
    "meta_process",
    "query_process",
    "restart_together",
    "start_meta",
    "start_query",
    "start_together",
    "wait_healthy",
]


#: How a server process is launched from ``-m MODULE ARGS``: as ``python -m`` does,
#: but without the packages the server image does not install. The test environment
#: has lake-sdk's DataFrame extras, and pyarrow imports pandas whenever it can (about
#: a fifth of a server's start-up); a server that needed it would fail when deployed.
_AS_DEPLOYED = """
import runpy, sys

class _NotInstalled:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in ("pandas", "polars"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled)
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def server_command(args: list[str]) -> list[str]:
    """The command line for ``python ARGS``; ``-m MODULE ...`` runs as it would deployed."""
    if args[:1] == ["-m"]:
        return [sys.executable, "-c", _AS_DEPLOYED, *args[1:]]
    return [sys.executable, *args]


#: Ports this process handed out: a port picked but not yet listened on can be
#: handed out again by the kernel, and two servers would then race for it.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@dataclass
class LakeProcess:
    """One running Lake server process and where its output goes."""

    name: str
    args: list[str]
    addr: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    #: Bearer token for the readiness probe (gRPC Health is authenticated).
    probe_token: str | None = None
    #: CA bundle the server's TLS certificate chains to (None: plaintext).
    ca_pem: bytes | None = None
    #: Name the certificate carries, if not the dialled host.
    server_name: str | None = None

    @property
    def tls(self) -> bool:
        return self.ca_pem is not None

    @property
    def url(self) -> str:
        return f"grpc+tls://{self.addr}" if self.tls else f"grpc://{self.addr}"

    @property
    def http_url(self) -> str:
        """The URL form ``lake query --metadata-addr`` takes."""
        return f"https://{self.addr}" if self.tls else f"http://{self.addr}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 60.0) -> LakeProcess:
        self.launch()
        wait_healthy(self, timeout_s)
        return self

    def launch(self) -> LakeProcess:
        """Start the process without waiting for it to report SERVING."""
        env = {**os.environ, **self.env}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                server_command(self.args),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        return self.proc.returncode

    def restart(self, timeout_s: float = 60.0) -> LakeProcess:
        self.stop()
        return self.start(timeout_s)


#: A probe's channel retries a refused connection at most this far apart. gRPC's default
#: backoff grows to 120 s, so a server that takes long to start (a loaded machine) would be
#: noticed only many seconds after it listens.
PROBE_BACKOFF = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def _channel(process: LakeProcess) -> grpc.Channel:
    if not process.tls:
        return grpc.insecure_channel(process.addr, options=PROBE_BACKOFF)
    options = list(PROBE_BACKOFF)
    if process.server_name:
        options.append(("grpc.ssl_target_name_override", process.server_name))
    creds = grpc.ssl_channel_credentials(root_certificates=process.ca_pem)
    return grpc.secure_channel(process.addr, creds, options=options)


def wait_healthy(process: LakeProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    metadata = (("authorization", f"Bearer {process.probe_token}"),) if process.probe_token else ()
    with _channel(process) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert process.proc is not None
            if process.proc.poll() is not None:
                raise RuntimeError(
                    f"{process.name} exited with {process.proc.returncode}:\n{process.log()[-4000:]}"
                )
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0, metadata=metadata)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.1)
    process.stop()
    raise TimeoutError(
        f"{process.name} not healthy after {timeout_s}s ({last}):\n{process.log()[-4000:]}"
    )


def meta_process(
    data_dir: Path,
    log_dir: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    probe_token: str | None = None,
    ca_pem: bytes | None = None,
    server_name: str | None = None,
) -> LakeProcess:
    """A Metasrv process, not started yet (see :func:`start_together`)."""
    addr = f"127.0.0.1:{port or free_port()}"
    args = ["-m", "lake_metasrv", "--addr", addr, "--data-dir", str(data_dir)]
    name = f"meta-{addr.rsplit(':', 1)[1]}"
    process = LakeProcess(name, args, addr, log_dir / f"{name}.log", dict(env or {}))
    process.probe_token, process.ca_pem, process.server_name = probe_token, ca_pem, server_name
    return process


def start_meta(
    data_dir: Path,
    log_dir: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    probe_token: str | None = None,
    ca_pem: bytes | None = None,
    server_name: str | None = None,
) -> LakeProcess:
    return meta_process(
        data_dir,
        log_dir,
        port=port,
        env=env,
        probe_token=probe_token,
        ca_pem=ca_pem,
        server_name=server_name,
    ).start()


def query_process(
    meta_addr: str,
    log_dir: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    metadata_url: str | None = None,
    probe_token: str | None = None,
    ca_pem: bytes | None = None,
    server_name: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> LakeProcess:
    """A Query replica, not started yet; ``metadata_url`` (e.g. ``https://...``) overrides
    ``http://meta_addr``."""
    addr = f"127.0.0.1:{port or free_port()}"
    metadata = metadata_url or f"http://{meta_addr}"
    args = ["-m", "lake_query", "--addr", addr, "--metadata-addr", metadata, *extra_args]
    name = f"query-{addr.rsplit(':', 1)[1]}"
    process = LakeProcess(name, args, addr, log_dir / f"{name}.log", dict(env or {}))
    process.probe_token, process.ca_pem, process.server_name = probe_token, ca_pem, server_name
    return process


def start_query(
    meta_addr: str,
    log_dir: Path,
    *,
    port: int | None = None,
    env: dict[str, str] | None = None,
    metadata_url: str | None = None,
    probe_token: str | None = None,
    ca_pem: bytes | None = None,
    server_name: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> LakeProcess:
    """A Query replica; ``metadata_url`` (e.g. ``https://...``) overrides ``http://meta_addr``."""
    return query_process(
        meta_addr,
        log_dir,
        port=port,
        env=env,
        metadata_url=metadata_url,
        probe_token=probe_token,
        ca_pem=ca_pem,
        server_name=server_name,
        extra_args=extra_args,
    ).start()


def start_together(*processes: LakeProcess, timeout_s: float = 60.0) -> None:
    """Launch every process at once, then wait until each reports SERVING.

    A server's start-up is mostly single-threaded imports, so on two cores a
    Metasrv and its Query replicas start in about the time of the slowest one
    instead of the sum. A Query replica started beside its Metasrv binds and
    reports NOT_SERVING until its first catalog snapshot arrives (``lake
    query``'s documented start-up order), so when this returns every process
    is as ready as one started after the other. A process already launched
    (a Metasrv a fixture launched for the test's first replicas) is only
    waited for. If any fails to start, every one is stopped before the error
    propagates.
    """
    _launch_and_wait([p for p in processes if p.proc is None], processes, timeout_s)


def restart_together(*processes: LakeProcess, timeout_s: float = 60.0) -> None:
    """Stop every process (as :meth:`LakeProcess.stop`), then start them all together."""
    for process in processes:
        process.stop()
    _launch_and_wait(processes, processes, timeout_s)


def _launch_and_wait(
    launch: Sequence[LakeProcess], processes: Sequence[LakeProcess], timeout_s: float
) -> None:
    try:
        for process in launch:
            process.launch()
        for process in processes:
            wait_healthy(process, timeout_s)
    except BaseException:
        for process in processes:
            process.stop()
        raise
