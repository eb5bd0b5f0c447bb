"""A streamed plan hands the reader exactly the files the eager plan returns.

A direct read of a plain projection plans as it reads: each manifest's data
files go to the reader as pyiceberg's planner reads that manifest
(lake_iceberg.federation.scan, ``PinnedSnapshot._streamed_tasks``). A
differential test over generated tables: seeded random histories of appends,
overwrites, deletes (copy-on-write, so manifests hold DELETED and EXISTING
entries), an append of no rows and an added column. At every snapshot of
every history, the streamed files equal the eager plan's (pyiceberg's
``plan_files``), in order, and the rows read equal pyiceberg's ``to_arrow``
as a multiset; a second streamed plan, decoded from the manifest bytes the
replica kept (lake_iceberg.federation.contents), equals it too. Then the cases that must not stream or must fail typed: a
delete manifest and an identity partition fall back to the eager plan, a
manifest gone from storage is DataCorrupted, an expired snapshot is still
VersionReclaimed before any read.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyiceberg.expressions import GreaterThanOrEqual, LessThan
from pyiceberg.manifest import ManifestContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from lake_core.errors import DataCorrupted, VersionReclaimed
from lake_iceberg.federation import IcebergFederation
from lake_iceberg.federation.contents import ManifestBytes, ManifestLists
from lake_iceberg.federation.manifests import live_entries
from lake_iceberg.federation.scan import PinnedSnapshot
from tools.lake_testing.iceberg import SeaweedIceberg, in_process_federation

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

NAMESPACE = "streamed"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "s", StringType(), required=False),
)
SEEDS = (1, 2, 3, 4)


def _rows(rng: random.Random, start: int, count: int, extra: bool) -> pa.Table:
    columns: dict[str, Any] = {
        "id": pa.array(range(start, start + count), pa.int64()),
        "s": pa.array([rng.choice(["a", "bb", "", None]) for _ in range(count)], pa.large_string()),
    }
    if extra:
        columns["n"] = pa.array([rng.randint(-5, 5) for _ in range(count)], pa.int64())
    return pa.table(columns)


def _history(catalog: Any, name: str, seed: int) -> Any:
    """A table with a seeded random history of appends, overwrites and deletes."""
    rng = random.Random(seed)
    table = catalog.create_table((NAMESPACE, name), schema=SCHEMA)
    next_id, extra = 0, False
    for _ in range(rng.randint(6, 10)):
        op = rng.choice(["append", "append", "append", "overwrite", "delete", "empty", "evolve"])
        if op == "evolve" and not extra:
            with table.update_schema() as update:
                update.add_column("n", LongType())
            extra = True
        elif op == "delete" and next_id:
            table.delete(LessThan("id", rng.randint(0, next_id)))
        elif op == "overwrite" and next_id:
            cut = rng.randint(0, next_id)
            count = rng.randint(1, 40)
            table.overwrite(
                _rows(rng, next_id, count, extra), overwrite_filter=GreaterThanOrEqual("id", cut)
            )
            next_id += count
        elif op == "empty":
            table.append(_rows(rng, next_id, 0, extra))
        else:
            count = rng.randint(1, 60)
            table.append(_rows(rng, next_id, count, extra))
            next_id += count
        table = catalog.load_table((NAMESPACE, name))
    return table


@pytest.fixture(scope="module")
def federation(iceberg_server: SeaweedIceberg) -> Iterator[IcebergFederation]:
    iceberg_server.catalog().create_namespace(NAMESPACE)
    with in_process_federation(iceberg_server, NAMESPACE) as fed:
        yield fed


@pytest.fixture(scope="module")
def histories(iceberg_server: SeaweedIceberg, federation: IcebergFederation) -> dict[str, Any]:
    catalog = iceberg_server.catalog()
    return {f"h{seed}": _history(catalog, f"h{seed}", seed) for seed in SEEDS}


def _pinned(federation: IcebergFederation, name: str, snapshot_id: int | None) -> PinnedSnapshot:
    pinned = federation.pinned(NAMESPACE, name, snapshot_id)._pinned
    assert pinned is not None
    return pinned


def _plain(value: Any) -> Any:
    """A manifest entry's every field, nested records and maps included, comparable by value."""
    if isinstance(value, Record):
        return tuple(_plain(value[i]) for i in range(len(value)))
    if isinstance(value, Mapping):
        return sorted((k, _plain(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _multiset(table: pa.Table) -> Counter[str]:
    return Counter(repr(sorted(row.items())) for row in table.to_pylist())


@pytest.mark.parametrize("seed", SEEDS)
def test_a_streamed_plan_equals_the_eager_plan_at_every_snapshot(
    federation: IcebergFederation, histories: dict[str, Any], seed: int
) -> None:
    name = f"h{seed}"
    table = histories[name]
    snapshots = table.metadata.snapshots
    assert len(snapshots) >= 4
    for snapshot in snapshots:
        pinned = _pinned(federation, name, snapshot.snapshot_id)
        streamed = pinned._streamed_tasks(pinned._io())
        assert streamed is not None  # data manifests only, unpartitioned
        got = [(t.file.file_path, t.file.record_count) for t in streamed]
        eager = [(t.file.file_path, t.file.record_count) for t in pinned._tasks(None)]
        assert got == eager, snapshot.snapshot_id
        # Every manifest and the list are kept now: this plan makes no metadata request.
        io = pinned._io()
        for manifest in snapshot.manifests(io):
            assert federation.manifests.get(manifest.manifest_path, manifest.manifest_length)
        assert federation.manifest_lists.get(snapshot.manifest_list) is not None
        again = pinned._streamed_tasks(io)
        assert again is not None
        assert [(t.file.file_path, t.file.record_count) for t in again] == eager
        # The rows read equal pyiceberg's own scan of the same snapshot.
        schema = table.scan(snapshot_id=snapshot.snapshot_id).projection().as_arrow()
        promised = pa.schema(
            [(f.name, pa.string() if f.type == pa.large_string() else f.type) for f in schema]
        )
        batches = pinned.batches(promised, 7)
        assert batches is not None
        read = pa.Table.from_batches(list(batches), schema=promised)
        expected = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().cast(promised)
        assert _multiset(read) == _multiset(expected), snapshot.snapshot_id


def test_the_histories_rewrite_and_delete_files(histories: dict[str, Any]) -> None:
    """The generated histories hold what makes manifests non-trivial (a test of the test)."""
    operations = {
        snapshot.summary.operation.value
        for table in histories.values()
        for snapshot in table.metadata.snapshots
        if snapshot.summary is not None
    }
    assert {"append", "overwrite", "delete"} <= operations, operations
    assert any("n" in t.schema().column_names for t in histories.values())  # an evolved schema


def test_live_entries_equal_pyiceberg_fetch_manifest_entry(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation, histories: dict[str, Any]
) -> None:
    """Lake's manifest read (a reused reader tree) against pyiceberg's, entry by entry.

    Over every manifest of every history and of a bucket-partitioned table,
    whose manifests embed another schema (its partition tuple) than the
    unpartitioned ones, read alternately so each reuses a tree the other built.
    """
    catalog = iceberg_server.catalog()
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket"))
    bucketed = catalog.create_table((NAMESPACE, "bucketed"), SCHEMA, partition_spec=spec)
    for part in range(3):
        bucketed.append(_rows(random.Random(part), part * 20, 20, False))
    bucketed = catalog.load_table((NAMESPACE, "bucketed"))
    tables = [*histories.values(), bucketed]
    manifests = [
        (table.io, manifest)
        for table in tables
        for snapshot in table.metadata.snapshots
        for manifest in snapshot.manifests(table.io)
    ]
    kept = ManifestBytes()
    for io, manifest in manifests + manifests[::-1]:
        ours = [_plain(e) for e in live_entries(io, manifest)]
        theirs = [_plain(e) for e in manifest.fetch_manifest_entry(io, discard_deleted=True)]
        assert ours == theirs, manifest.manifest_path
        # Read again from bytes kept by the first pass (filled on it).
        assert [_plain(e) for e in live_entries(io, manifest, kept)] == theirs
    assert len(kept) == len({m.manifest_path for _, m in manifests})
    pinned = _pinned(federation, "bucketed", bucketed.metadata.current_snapshot_id)
    streamed = pinned._streamed_tasks(pinned._io())
    assert streamed is not None  # a bucket keeps its values in the files
    assert [t.file.file_path for t in streamed] == [t.file.file_path for t in pinned._tasks(None)]


def test_a_delete_manifest_is_planned_whole(
    federation: IcebergFederation, histories: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"h{SEEDS[0]}"
    # Nothing kept from earlier reads: the (patched) manifest list is read.
    monkeypatch.setattr(federation, "manifest_lists", ManifestLists())
    pinned = _pinned(federation, name, histories[name].metadata.current_snapshot_id)
    real = Snapshot.manifests
    deletes = SimpleNamespace(content=ManifestContent.DELETES, partition_spec_id=0)
    monkeypatch.setattr(Snapshot, "manifests", lambda self, io: [*real(self, io), deletes])
    assert pinned._streamed_tasks(pinned._io()) is None


def test_an_identity_partition_is_planned_whole(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation
) -> None:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "s"))
    table = iceberg_server.catalog().create_table(
        (NAMESPACE, "parted"), SCHEMA, partition_spec=spec
    )
    rows = {"id": pa.array(range(10), pa.int64()), "s": pa.array(["a", "b"] * 5, pa.large_string())}
    table.append(pa.table(rows))
    pinned = _pinned(federation, "parted", federation.plan(NAMESPACE, "parted").snapshot_id)
    assert pinned._streamed_tasks(pinned._io()) is None
    assert pinned.batches(pa.schema([("id", pa.int64()), ("s", pa.string())]), 1024) is None


def test_a_manifest_gone_from_storage_fails_the_stream_as_data_corrupted(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation
) -> None:
    catalog = iceberg_server.catalog()
    table = catalog.create_table((NAMESPACE, "lost"), schema=SCHEMA)
    for part in range(5):
        table.append(_rows(random.Random(part), part * 10, 10, False))
    table = catalog.load_table((NAMESPACE, "lost"))
    pinned = _pinned(federation, "lost", table.metadata.current_snapshot_id)
    manifest = table.current_snapshot().manifests(table.io)[-1].manifest_path
    location = urlparse(manifest)
    iceberg_server.client().delete_object(Bucket=location.netloc, Key=location.path.lstrip("/"))
    batches = pinned.batches(pa.schema([("id", pa.int64())]), 1024)
    assert batches is not None  # the manifest list is whole: the plan streams
    with pytest.raises(DataCorrupted, match=r"iceberg\.streamed\.lost snapshot"):
        list(batches)


def test_an_expired_snapshot_is_refused_before_any_read(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation
) -> None:
    catalog = iceberg_server.catalog()
    table = catalog.create_table((NAMESPACE, "expired"), schema=SCHEMA)
    table.append(_rows(random.Random(0), 0, 10, False))
    first = catalog.load_table((NAMESPACE, "expired")).metadata.current_snapshot_id
    table = catalog.load_table((NAMESPACE, "expired"))
    table.append(_rows(random.Random(1), 10, 10, False))
    table = catalog.load_table((NAMESPACE, "expired"))
    assert first is not None
    table.maintenance.expire_snapshots().by_id(first).commit()
    with pytest.raises(VersionReclaimed):
        federation.pinned(NAMESPACE, "expired", first)
