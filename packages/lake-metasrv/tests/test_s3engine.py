"""The S3 engine on SeaweedFS with Lance's manifests in dynalite.

Appends are a compare-and-swap on the Lance version (no rebasing onto
unregistered versions), retention keeps tagged and branched versions and
deletes manifest rows only for versions Lance no longer lists, and a
re-created table starts from nothing.
"""

from __future__ import annotations

import asyncio

import lance
import pyarrow as pa
import pytest

from lake_core.cloud import DatasetStorage
from lake_core.errors import VersionReclaimed
from lake_core.models import incarnation_of
from lake_metasrv.engine.s3 import S3LanceEngine
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3

pytestmark = [pytest.mark.s3, pytest.mark.dynamodb]

SCHEMA = pa.schema([("id", pa.int64())])


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids)}, schema=SCHEMA)


@pytest.fixture
def storage(
    s3_server: SeaweedS3, dynamodb_server: Dynalite, monkeypatch: pytest.MonkeyPatch
) -> DatasetStorage:
    env = {**s3_server.env(), **dynamodb_server.env(), "LAKE_STORAGE_TIMEOUT_MS": "5000"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    table = dynamodb_server.manifest_table()
    return DatasetStorage.from_env({**env, "LAKE_MANIFEST_DYNAMODB_TABLE": table})


@pytest.fixture
def location(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/tables/robots/episodes.lance"


def ids(storage: DatasetStorage, location: str, version: int) -> list[int]:
    dataset = lance.dataset(
        storage.lance_uri(location),
        version=version,
        storage_options=storage.storage_options(location),
    )
    return sorted(dataset.to_table()["id"].to_pylist())


@pytest.mark.asyncio
async def test_appends_commit_exactly_on_the_registered_version(
    storage: DatasetStorage, location: str
) -> None:
    engine = S3LanceEngine(10, storage)
    created = await engine.create(location, SCHEMA, "inc-1")
    first = await engine.append(location, "inc-1", created, rows(1, 2))
    assert first == created + 1
    # An orphan: a Lance version the registry never recorded (a crashed commit).
    orphan = lance.write_dataset(
        rows(666),
        storage.lance_uri(location),
        mode="append",
        storage_options=storage.storage_options(location),
    )
    assert orphan.version == first + 1
    # Lance alone would rebase the next append onto the orphan; the engine restores first.
    second = await engine.append(location, "inc-1", first, rows(3))
    assert second > orphan.version
    assert ids(storage, location, second) == [1, 2, 3]
    assert ids(storage, location, first) == [1, 2]
    dataset = lance.dataset(
        storage.lance_uri(location), storage_options=storage.storage_options(location)
    )
    assert incarnation_of(dataset.schema.metadata) == "inc-1"
    assert dataset.version == second


@pytest.mark.asyncio
async def test_retention_keeps_tags_and_branches_and_reclaims_only_dropped_manifests(
    storage: DatasetStorage, location: str
) -> None:
    engine = S3LanceEngine(2, storage, retain_min_age_secs=0)  # count window alone
    version = await engine.create(location, SCHEMA, "inc-1")
    versions = [version]
    for i in range(3):
        version = await engine.append(location, "inc-1", version, rows(i))
        versions.append(version)
    tagged, branched = versions[1], versions[2]
    latest = lance.dataset(
        storage.lance_uri(location), storage_options=storage.storage_options(location)
    )
    latest.tags.create("keep", tagged)
    latest.create_branch("experiment", branched, storage_options=storage.storage_options(location))
    for i in range(3, 6):
        version = await engine.append(location, "inc-1", version, rows(i))
        versions.append(version)

    removed = await asyncio.to_thread(engine.cleanup_now, location, version)
    assert removed > 0
    kept = {
        v["version"]
        for v in lance.dataset(
            storage.lance_uri(location), storage_options=storage.storage_options(location)
        ).versions()
    }
    assert kept == {tagged, branched, version - 1, version}
    assert ids(storage, location, tagged) == [0]  # a tag protects its version
    assert ids(storage, location, branched) == [0, 1]  # so does a branch
    with pytest.raises(VersionReclaimed):
        await engine.read(location, versions[3])
    rows_left = sorted(engine._manifest_rows(location))
    assert rows_left == sorted(kept), "manifest rows remain exactly for versions Lance kept"
    # The table still takes appends after retention.
    after = await engine.append(location, "inc-1", version, rows(99))
    assert ids(storage, location, after) == [0, 1, 2, 3, 4, 5, 99]


@pytest.mark.asyncio
async def test_a_recreated_table_starts_from_nothing(
    storage: DatasetStorage, location: str
) -> None:
    engine = S3LanceEngine(10, storage)
    version = await engine.create(location, SCHEMA, "inc-1")
    version = await engine.append(location, "inc-1", version, rows(1))
    await engine.remove(location)
    assert engine._manifest_rows(location) == []
    fresh = await engine.create(location, SCHEMA, "inc-2")
    assert fresh == 1
    assert ids(storage, location, fresh) == []
    again = await engine.append(location, "inc-2", fresh, rows(7))
    assert ids(storage, location, again) == [7]


@pytest.mark.asyncio
async def test_age_floor_on_s3_keeps_recent_versions_and_probes_reclaimed_ones(
    storage: DatasetStorage, location: str
) -> None:
    engine = S3LanceEngine(2, storage, retain_min_age_secs=60)
    version = await engine.create(location, SCHEMA, "inc-1")
    for i in range(4):
        version = await engine.append(location, "inc-1", version, rows(i))

    def kept() -> list[int]:
        dataset = lance.dataset(
            storage.lance_uri(location), storage_options=storage.storage_options(location)
        )
        return sorted(v["version"] for v in dataset.versions())

    every = kept()
    assert len(every) == 5
    assert await asyncio.to_thread(engine.cleanup_now, location, version) == 0
    real = engine.clock
    engine.clock = lambda: real() + 3600  # an hour on: the count window alone decides
    assert await asyncio.to_thread(engine.cleanup_now, location, version) == 3
    assert kept() == [version - 1, version]
    for i in range(4, 6):
        version = await engine.append(location, "inc-1", version, rows(i))
    # Back to now: the search for the oldest young version meets reclaimed
    # manifests on S3 (treated as old) and keeps every young one.
    engine.clock = real
    assert await asyncio.to_thread(engine.cleanup_now, location, version) == 0
    assert kept() == list(range(version - 3, version + 1))
    assert ids(storage, location, version - 3) == [0, 1, 2]
