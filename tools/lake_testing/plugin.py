"""pytest fixtures shared by every test directory (loaded with ``-p``)."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import (
    LakeProcess,
    meta_process,
    query_process,
    restart_together,
    start_meta,
    start_together,
)


def pytest_configure(config: pytest.Config) -> None:
    """Every process the tests start keeps its compiled bytecode, under ``.cache/pycache``.

    With ``PYTHONDONTWRITEBYTECODE`` set (as on the CI machine), each of the
    suite's several hundred server and CLI processes compiled every module it
    imports from source: well over half of a Metasrv's or Query replica's
    start-up CPU. Child processes now write and reuse their ``.pyc`` files in
    one cache directory outside the source trees (``PYTHONPYCACHEPREFIX``), so
    no ``__pycache__`` appears beside any source, and a changed source is
    recompiled as always (the ``.pyc`` records its source's mtime and size).
    A ``PYTHONPYCACHEPREFIX`` already set is kept.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(config.rootpath / ".cache" / "pycache"))


@dataclass
class LakeCluster:
    """One Metasrv and any number of Query replicas, on loopback."""

    root: Path
    meta: LakeProcess
    queries: list[LakeProcess] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def query(self) -> LakeProcess:
        return self.queries[0]

    def add_query(self) -> LakeProcess:
        return self.add_queries(1)[0]

    def add_queries(self, count: int) -> list[LakeProcess]:
        """``count`` more Query replicas, started together."""
        replicas = [query_process(self.meta.addr, self.root, env=self.env) for _ in range(count)]
        start_together(*replicas)
        self.queries.extend(replicas)
        return replicas

    @classmethod
    def start(
        cls,
        root: Path,
        env: dict[str, str],
        queries: int = 1,
        *,
        meta_env: dict[str, str] | None = None,
    ) -> LakeCluster:
        """A Metasrv on ``root / "data"`` and ``queries`` replicas, all started together.

        Replicas get ``env``; the Metasrv gets ``meta_env`` (default: ``env`` too).
        """
        meta = meta_process(root / "data", root, env=env if meta_env is None else meta_env)
        replicas = [query_process(meta.addr, root, env=env) for _ in range(queries)]
        start_together(meta, *replicas)
        return cls(root=root, meta=meta, queries=replicas, env=env)

    def replace_meta(self, env: dict[str, str]) -> LakeProcess:
        """A Metasrv with ``env`` added (armed faults, say) in place of ``meta``: same port, same data.

        ``meta`` itself is stopped, not replaced: ``meta.start()`` brings it
        back later. Every Query replica restarts after the new Metasrv is up,
        so the next request reaches that process: a replica whose channel saw
        the old Metasrv go away may still be in gRPC's reconnect backoff and
        would fail that request fast (UNAVAILABLE) without sending it.
        """
        self.meta.stop()
        port = int(self.meta.addr.rsplit(":", 1)[1])
        replacement = start_meta(self.root / "data", self.root, port=port, env={**self.env, **env})
        try:
            restart_together(*self.queries)
        except BaseException:
            replacement.stop()
            raise
        return replacement

    def stop(self) -> None:
        for replica in self.queries:
            replica.stop()
        self.meta.stop()


def write_ticket_keys(path: Path) -> Path:
    """A key ring shared by several Query replicas, as an operator would write it."""
    key = base64.b64encode(os.urandom(32)).decode()
    path.write_text(json.dumps({"active": "k1", "keys": [{"id": "k1", "key": key}]}))
    path.chmod(0o600)
    return path


def cluster_env(root: Path) -> dict[str, str]:
    """``lake_cluster``'s environment: a ticket key ring, the local managed stage."""
    return {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        # Query hands SDKs Metasrv's local managed stage (FILE uploads).
        "LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects"),
    }


@pytest.fixture
def lake_cluster(tmp_path: Path) -> Iterator[LakeCluster]:
    """A fresh Metasrv plus one Query replica sharing a ticket key ring."""
    cluster = LakeCluster.start(tmp_path, cluster_env(tmp_path))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS S3 server for the whole session (tests use their own buckets)."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: SeaweedS3, request: pytest.FixtureRequest) -> str:
    """A fresh bucket for this test."""
    name = (
        "t-"
        + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
        + "-"
        + os.urandom(3).hex()
    )
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def dynamodb_server(tmp_path: Path) -> Iterator[Dynalite]:
    """A dynalite process for this test, free to be restarted."""
    server = Dynalite(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread (Ctrl-C tests)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
