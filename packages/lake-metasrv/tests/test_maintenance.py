"""Maintenance commits (compaction, scalar indexes) on a local coordinator, over Flight.

Each test checks the three things a maintenance commit must keep: the same
rows, the same Lake version, and a registry that never points at a Lance
version holding anything else.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import lance
import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StaleReadVersion,
    TableNotFound,
)
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.maintenance import AutoCompactor, CompactionSettings, Maintenance
from lake_metasrv.registry.base import MaintenanceCommit

T = TableRef("robots", "episodes")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.utf8()), ("pos", pa.struct([("x", pa.float64())]))]
)


def rows(start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"r{i}" for i in ids]),
            pa.array([{"x": float(i)} for i in ids]),
        ],
        schema=SCHEMA,
    )


async def append(coordinator: CommitCoordinator, start: int, n: int = 10) -> int:
    command = protocol.AppendCommand(table=T, operation_id=new_operation_id())
    result = await coordinator.append(command, SCHEMA, [rows(start, n)])
    return result.version


async def table_with_appends(coordinator: CommitCoordinator, appends: int, n: int = 10) -> None:
    await coordinator.create_table(T, SCHEMA)
    for i in range(appends):
        await append(coordinator, i * n, n)


def sorted_rows(location: str, engine_version: int) -> pa.Table:
    return lance.dataset(location, version=engine_version).to_table().sort_by("id")


def maintenance(coordinator: CommitCoordinator, **settings: Any) -> Maintenance:
    return Maintenance(coordinator, CompactionSettings(**settings))


@pytest.mark.asyncio
async def test_compaction_keeps_rows_and_version_and_moves_engine_version(
    coordinator: CommitCoordinator,
) -> None:
    await table_with_appends(coordinator, 12)
    before = await coordinator.describe_table(T)
    generation = await coordinator.registry.generation()

    result = await maintenance(coordinator).compact(T)

    after = await coordinator.describe_table(T)
    assert result.changed
    assert (result.fragments_before, result.fragments_after) == (12, 1)
    assert after.version == before.version == 12
    assert after.engine_version > before.engine_version == result.previous_engine_version
    assert result.descriptor == after.descriptor()
    assert await coordinator.registry.generation() != generation
    assert sorted_rows(after.location, after.engine_version).equals(
        sorted_rows(before.location, before.engine_version)
    )
    assert len(lance.dataset(after.location, version=after.engine_version).get_fragments()) == 1
    history = await coordinator.registry.versions(after.incarnation)
    assert [v.version for v in history] == list(range(13))
    assert history[-1].engine_version == after.engine_version

    # Nothing left to do: no new Lance version, no registry change.
    again = await maintenance(coordinator).compact(T)
    assert not again.changed
    assert lance.dataset(after.location).latest_version == after.engine_version
    # The next append lands on the compacted version, gap-free.
    assert await append(coordinator, 10_000) == 13
    final = await coordinator.describe_table(T)
    assert lance.dataset(final.location, version=final.engine_version).count_rows() == 130


@pytest.mark.asyncio
async def test_index_is_created_and_used_and_bad_columns_write_nothing(
    coordinator: CommitCoordinator,
) -> None:
    await table_with_appends(coordinator, 3)
    before = await coordinator.describe_table(T)
    latest = lance.dataset(before.location).latest_version
    for column, kind in (("nope", "BTREE"), ("pos", "BTREE"), ("id", "VECTOR"), ("id", "btree ")):
        with pytest.raises(InvalidArgument):
            await maintenance(coordinator).create_index(T, column, kind)
    assert lance.dataset(before.location).latest_version == latest
    assert await coordinator.describe_table(T) == before

    result = await maintenance(coordinator).create_index(T, "id")
    after = await coordinator.describe_table(T)
    assert result.changed
    assert result.indexes == ["id_idx"]
    assert after.version == before.version
    dataset = lance.dataset(after.location, version=after.engine_version)
    assert [d.name for d in dataset.describe_indices()] == ["id_idx"]
    plan = dataset.scanner(filter="id IN (3, 17)").explain_plan()
    assert "ScalarIndexQuery" in plan
    assert dataset.to_table(filter="id = 17").column("name").to_pylist() == ["r17"]

    # Appends after the index leave fragments it does not cover; optimize covers them.
    await append(coordinator, 100)
    await append(coordinator, 110)
    optimized = await maintenance(coordinator).compact(T)
    assert optimized.changed
    assert optimized.fragments_after == 1
    final = await coordinator.describe_table(T)
    dataset = lance.dataset(final.location, version=final.engine_version)
    assert dataset.stats.index_stats("id_idx")["num_unindexed_fragments"] == 0
    assert dataset.count_rows() == 50


@pytest.mark.asyncio
async def test_compaction_never_carries_an_orphans_rows(coordinator: CommitCoordinator) -> None:
    await table_with_appends(coordinator, 4)
    record = await coordinator.describe_table(T)
    # A Lance version nobody registered (as a crash after the Lance write leaves).
    orphan = lance.write_dataset(
        pa.Table.from_batches([rows(999, 5)]), record.location, mode="append"
    )
    assert orphan.version > record.engine_version

    await maintenance(coordinator).compact(T)
    after = await coordinator.describe_table(T)
    ids = sorted_rows(after.location, after.engine_version).column("id").to_pylist()
    assert ids == list(range(40))
    assert await append(coordinator, 40) == 5


@pytest.mark.asyncio
async def test_appends_racing_compaction_are_all_kept(coordinator: CommitCoordinator) -> None:
    await table_with_appends(coordinator, 30)
    work = maintenance(coordinator)
    results = await asyncio.gather(
        work.compact(T),
        *(append(coordinator, 1000 + 10 * i) for i in range(20)),
        work.create_index(T, "id"),
    )
    # Concurrent appends share versions (commit groups); none is lost or skipped.
    versions = set(results[1:-1])
    final = await coordinator.describe_table(T)
    assert versions == set(range(31, final.version + 1))
    history = await coordinator.registry.versions(final.incarnation)
    assert [v.version for v in history] == list(range(final.version + 1))
    ids = sorted_rows(final.location, final.engine_version).column("id").to_pylist()
    assert ids == list(range(300)) + list(range(1000, 1200))


@pytest.mark.asyncio
async def test_registry_refuses_maintenance_when_the_table_moved(
    coordinator: CommitCoordinator,
) -> None:
    await table_with_appends(coordinator, 1)
    record = await coordinator.describe_table(T)
    stale = MaintenanceCommit(T, record.incarnation, record.version, record.engine_version - 1, 99)
    with pytest.raises(StaleReadVersion):
        await coordinator.registry.commit_maintenance(stale)
    behind = replace(stale, expected_version=0, expected_engine_version=record.engine_version)
    with pytest.raises(StaleReadVersion):
        await coordinator.registry.commit_maintenance(behind)
    with pytest.raises(TableNotFound):
        await coordinator.registry.commit_maintenance(replace(stale, incarnation="other"))
    assert await coordinator.describe_table(T) == record


@pytest.mark.asyncio
async def test_background_compactor_waits_for_enough_small_fragments(
    coordinator: CommitCoordinator,
) -> None:
    await table_with_appends(coordinator, 5)
    compactor = AutoCompactor(maintenance(coordinator, min_small_fragments=8, min_gap_s=0))
    assert await compactor.tick() == []
    for i in range(3):
        await append(coordinator, 500 + 10 * i)
    assert await compactor.tick() == [T]
    record = await coordinator.describe_table(T)
    assert len(lance.dataset(record.location, version=record.engine_version).get_fragments()) == 1
    assert record.version == 8
    assert await compactor.tick() == []  # unchanged since examined


@pytest.mark.asyncio
async def test_a_stream_of_appends_gets_compacted_without_waiting_for_the_timer(
    coordinator: CommitCoordinator,
) -> None:
    # The timer and the per-table gap would hold it off for an hour: only the
    # append count can start this compaction, and only if a continuous
    # stream of appends lets maintenance take the table lock between groups.
    settings = {"min_small_fragments": 8, "appends_per_look": 24}
    compactor = AutoCompactor(maintenance(coordinator, interval_s=3600, min_gap_s=3600, **settings))
    await table_with_appends(coordinator, 1)
    compactor.start()
    try:

        async def writer(base: int) -> None:
            for i in range(15):
                await append(coordinator, base + 10 * i)

        await asyncio.gather(*(writer(10_000 * (w + 1)) for w in range(4)))
        for _ in range(200):  # the nudge runs on the compactor's own task
            record = await coordinator.describe_table(T)
            if record.engine_version != record.version + 1:
                break
            await asyncio.sleep(0.05)
    finally:
        await compactor.stop()
    record = await coordinator.describe_table(T)
    history = await coordinator.registry.versions(record.incarnation)
    held = [op for v in history for op in v.operation_ids]
    assert len(held) == len(set(held)) == 61, "every append is kept, once"
    # One fragment per commit group until compaction merged some.
    fragments = lance.dataset(record.location, version=record.engine_version).get_fragments()
    assert len(fragments) < record.version, "compacted while the appends streamed in"
    assert sorted_rows(record.location, record.engine_version).num_rows == 610


@pytest.mark.asyncio
async def test_maintenance_over_flight_needs_admin_and_returns_typed_errors(
    served: Any, kit: Any
) -> None:
    coordinator: CommitCoordinator = served.coordinator
    await table_with_appends(coordinator, 3)
    registered = (await coordinator.describe_table(T)).engine_version
    user = Principal(principal_id="u", tenant_id="t", role="user", namespaces=frozenset({"robots"}))
    async with (
        kit.serve_handler(coordinator, authenticate=lambda *_: user) as as_user,
        MetaClient(as_user.url) as client,
    ):
        with pytest.raises(PermissionDenied):
            await client.optimize_table(T)
        with pytest.raises(PermissionDenied):
            await client.create_index(T, "id")
    assert (await coordinator.describe_table(T)).engine_version == registered
    async with MetaClient(served.url) as client:
        optimized = await client.optimize_table(T)
        assert optimized.changed
        assert optimized.descriptor.version == 3
        indexed = await client.create_index(T, "id")
        assert indexed.indexes == ["id_idx"]
        with pytest.raises(InvalidArgument):
            await client.create_index(T, "pos")
        with pytest.raises(NotFound):
            await client.optimize_table(TableRef("robots", "missing"))


@pytest.mark.asyncio
async def test_every_maintenance_commit_writes_an_empty_sidecar_first(
    coordinator: CommitCoordinator,
) -> None:
    from lake_core.references import ReferenceDelta
    from lake_metasrv.sidecars.local import LocalSidecarStore

    await table_with_appends(coordinator, 4)
    before = await coordinator.describe_table(T)
    sidecars = coordinator.sidecars
    assert isinstance(sidecars, LocalSidecarStore)
    append_delta = sidecars.read_delta(before.incarnation, before.version)

    await maintenance(coordinator).compact(T)
    compacted = await coordinator.describe_table(T)
    await maintenance(coordinator).create_index(T, "id")
    indexed = await coordinator.describe_table(T)

    for record in (compacted, indexed):
        path = sidecars.path(record.incarnation, record.version, record.engine_version)
        delta = ReferenceDelta.model_validate_json(path.read_bytes())
        assert delta.schema_version == 2
        assert (delta.version, delta.engine_version) == (record.version, record.engine_version)
        assert delta.adds == []
        assert delta.drops == []
    # The append's own sidecar for that Lake version is untouched.
    assert sidecars.read_delta(before.incarnation, before.version) == append_delta
    # A schema 1 file (written before maintenance deltas existed) still reads.
    assert (
        ReferenceDelta.model_validate(
            {"table": T.model_dump(), "incarnation": "i", "version": 3, "adds": ["x"]}
        ).engine_version
        is None
    )
    with pytest.raises(ValueError):
        ReferenceDelta.model_validate(
            {
                "table": T.model_dump(),
                "incarnation": "i",
                "version": 3,
                "adds": [],
                "engine_version": 9,
            }
        )
