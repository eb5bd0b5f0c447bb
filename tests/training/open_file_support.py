"""Helpers for the open_file and video tests: store an object, read it back at random."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import lake_sdk
from lake_core.models import DataLocation
from lake_objects import FileUpload
from lake_sdk import ObjectFile
from tests.files.conftest import EPISODES, EPISODES_SCHEMA, INSERT
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import start_meta


def store_file(client: lake_sdk.Client, path: Path, episode: str) -> DataLocation:
    """Insert ``path`` as the video of one episode and return its DataLocation."""
    client.insert(INSERT, [episode, FileUpload.from_path(path, "application/octet-stream")])
    table = client.query_table(f"SELECT video FROM robots.episodes WHERE episode_id = '{episode}'")
    return lake_sdk.data_location(table, "video", 0)


def random_access(file: ObjectFile, data: bytes, operations: int, seed: int) -> None:
    """``operations`` random seeks (every whence) and reads (every method) against ``data``."""
    rng = random.Random(seed)
    size = len(data)
    position = 0
    for step in range(operations):
        kind = rng.random()
        if kind < 0.2:  # a sequential run, as decoders do after a seek
            length = rng.randint(1, 256 * 1024)
        elif kind < 0.9:
            length = rng.randint(0, 70_000)
        else:
            length = rng.randint(1, 3 * 1024 * 1024)
        whence = rng.choice((io.SEEK_SET, io.SEEK_CUR, io.SEEK_END))
        target = rng.randint(0, size + 10)  # sometimes past EOF
        offset = {io.SEEK_SET: target, io.SEEK_CUR: target - position, io.SEEK_END: target - size}
        if rng.random() < 0.8:
            position = file.seek(offset[whence], whence)
            assert position == target
        assert file.tell() == position
        method = rng.choice(("read", "readinto", "read1", "peek"))
        want = data[position : position + length]
        if method == "read":
            got = file.read(length)
        elif method == "read1":
            got = file.read1(length)
        elif method == "peek":
            got = file.peek(length)[:length]
            assert got[:1] == want[:1], step
            assert data[position : position + len(got)] == got, step
            continue
        else:
            buffer = bytearray(length)
            count = file.readinto(buffer)
            got = bytes(buffer[:count])
        assert got == want, (step, method, position, length)
        position += len(got)


@dataclass
class Stage:
    """One Metasrv and one Query replica on a managed stage, shared by a module's tests."""

    cluster: LakeCluster
    kind: str
    s3: SeaweedS3 | None = None
    bucket: str | None = None

    @property
    def url(self) -> str:
        return self.cluster.query.url

    def overwrite(self, location: DataLocation, body: bytes) -> None:
        """Replace the object's bytes behind Lake's back (corruption tests)."""
        if self.s3 is None:
            Path(location.uri.removeprefix("file://")).write_bytes(body)
            return
        key = location.uri.removeprefix(f"s3://{self.bucket}/")
        self.s3.client().put_object(Bucket=self.bucket, Key=key, Body=body)


def _start(root: Path, env: dict[str, str], kind: str, **extra: object) -> Stage:
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        **env,
    }
    meta = start_meta(root / "data", root, env=env)
    cluster = LakeCluster(root=root, meta=meta, env=env)
    try:
        cluster.add_query()
        create_table(meta.addr, EPISODES, EPISODES_SCHEMA)
    except BaseException:
        cluster.stop()
        raise
    return Stage(cluster, kind, **extra)  # type: ignore[arg-type]


# Session-scoped servers (starting a Metasrv and a Query costs seconds): every
# open_file and video test shares them, each with objects of its own.
@pytest.fixture(scope="session")
def _local_stage_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    root = tmp_path_factory.mktemp("local-stage")
    stage = _start(root, {"LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects")}, "local")
    try:
        yield stage
    finally:
        stage.cluster.stop()


@pytest.fixture
def local_stage(_local_stage_servers: Stage) -> Stage:
    return _local_stage_servers


@pytest.fixture(scope="session")
def _s3_stage_servers(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedS3
) -> Iterator[Stage]:
    root = tmp_path_factory.mktemp("s3-stage")
    bucket = "training-" + os.urandom(4).hex()
    s3_server.create_bucket(bucket)
    env = {
        "LAKE_S3_BUCKET": bucket,
        "LAKE_MANAGED_OBJECT_PREFIX": "lake/managed",
        **s3_server.env(),
    }
    stage = _start(root, env, "s3", s3=s3_server, bucket=bucket)
    try:
        yield stage
    finally:
        stage.cluster.stop()


@pytest.fixture
def s3_stage(_s3_stage_servers: Stage, monkeypatch: pytest.MonkeyPatch) -> Stage:
    """A managed S3 stage on SeaweedFS; this test's process (the SDK) gets the same AWS identity."""
    assert _s3_stage_servers.s3 is not None
    for key, value in _s3_stage_servers.s3.env().items():
        monkeypatch.setenv(key, value)
    return _s3_stage_servers
