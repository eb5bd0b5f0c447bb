"""Fixtures for recordings tests: one Lake per module (local stage), one on SeaweedFS S3.

Server start-up dominates on a loaded machine, so the local-stage tests of a
module share one Metasrv and Query; each test gets its own recordings table.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lake_core.names import TableRef
from lake_sdk.recordings import recordings_schema
from tests.files.conftest import S3Lake, s3_lake  # noqa: F401  (the S3 fixture, reused)
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys

RECORDINGS_SCHEMA = recordings_schema(["robot_id:utf8", "site:utf8", "shift:int64"])
_names = itertools.count()


def objects(root: Path) -> list[Path]:
    """Files on a local managed stage."""
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


@dataclass
class Recordings:
    """A running Lake and one fresh recordings table on it."""

    cluster: LakeCluster
    table: TableRef

    @property
    def url(self) -> str:
        return self.cluster.query.url

    @property
    def stage(self) -> Path:
        return self.cluster.root / "data" / "objects"


@pytest.fixture(scope="module")
def shared_lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeCluster]:
    """One Metasrv and one Query on a local stage for a whole test module."""
    root = tmp_path_factory.mktemp("lake")
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        "LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects"),
    }
    cluster = LakeCluster.start(root, env)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def local_recordings(shared_lake: LakeCluster) -> Recordings:
    """A fresh recordings table (standard columns + robot_id, site, shift) on the local stage."""
    table = TableRef("robots", f"recordings_{next(_names)}")
    create_table(shared_lake.meta.addr, table, RECORDINGS_SCHEMA)
    return Recordings(shared_lake, table)


@pytest.fixture
def s3_recordings(s3_lake: S3Lake) -> Recordings:  # noqa: F811
    table = TableRef("robots", "recordings")
    create_table(s3_lake.cluster.meta.addr, table, RECORDINGS_SCHEMA)
    return Recordings(s3_lake.cluster, table)
