"""Fixtures for FILE tests: a Lake on the local stage, and a Lake on SeaweedFS S3."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core import faults
from lake_core.filetype import file_field
from lake_core.names import TableRef
from tools.lake_testing.data import create_table
from tools.lake_testing.faults import fault_env, reset_process_faults
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.s3proxy import S3Proxy
from tools.lake_testing.seaweed import SeaweedS3

EPISODES = TableRef("robots", "episodes")
EPISODES_SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), file_field("video")])
INSERT = "INSERT INTO robots.episodes (episode_id, video) VALUES (?, ?)"
MIB = 1024 * 1024
PREFIX = "lake/managed"


def write_random(path: Path, size: int, seed: int = 0) -> Path:
    """A file of ``size`` pseudo-random bytes, written in 1 MiB steps."""
    import numpy as np

    rng = np.random.default_rng(seed)
    with path.open("wb") as out:
        left = size
        while left:
            step = min(left, MIB)
            out.write(rng.integers(0, 256, step, dtype=np.uint8).tobytes())
            left -= step
    return path


@pytest.fixture
def local_lake(lake_cluster: LakeCluster) -> LakeCluster:
    """The default cluster (local stage) with robots.episodes (episode_id, video FILE)."""
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    return lake_cluster


@dataclass
class S3Lake:
    cluster: LakeCluster
    server: SeaweedS3
    bucket: str
    proxy: S3Proxy

    @property
    def url(self) -> str:
        return self.cluster.query.url

    def client(self):  # type: ignore[no-untyped-def]
        return self.server.client()

    def open_uploads(self) -> list[dict[str, object]]:
        reply = self.client().list_multipart_uploads(Bucket=self.bucket)
        return list(reply.get("Uploads", []))


@pytest.fixture
def s3_lake(
    tmp_path: Path,
    s3_server: SeaweedS3,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[S3Lake]:
    """Metasrv and Query on an S3 managed stage (SeaweedFS behind a counting proxy).

    This test process is the SDK: its environment gets the same AWS identity,
    and test hooks that make new uploads use 5 MiB parts.
    """
    proxy = S3Proxy(s3_server.endpoint).start()
    aws = {**s3_server.env(), "AWS_ENDPOINT_URL_S3": proxy.endpoint}
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(tmp_path / "ticket-keys.json")),
        "LAKE_S3_BUCKET": s3_bucket,
        "LAKE_MANAGED_OBJECT_PREFIX": PREFIX,
        **aws,
    }
    for key, value in {**aws, **fault_env(f"{faults.UPLOAD_PART_SIZE}={5 * MIB}")}.items():
        monkeypatch.setenv(key, value)
    faults.configure()  # this process is the SDK: its new uploads use 5 MiB parts
    cluster = LakeCluster.start(tmp_path, env)
    try:
        create_table(cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
        yield S3Lake(cluster, s3_server, s3_bucket, proxy)
    finally:
        reset_process_faults()
        cluster.stop()
        proxy.stop()


def sdk_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment (with the AWS identity), for SDK subprocesses."""
    return {**os.environ, **(extra or {})}
