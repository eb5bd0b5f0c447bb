"""DynamoRegistry.commit_maintenance against dynalite: compare-and-swap, fencing, history."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from lake_core.errors import StaleReadVersion, TableNotFound
from lake_core.ids import new_operation_id, operation_time_ms
from lake_core.names import TableRef
from lake_core.schemas import schema_to_ipc
from lake_metasrv.registry.base import AppendCommit, MaintenanceCommit, TableRecord
from lake_metasrv.registry.dynamo import DynamoRegistry, NotLeader
from tools.lake_testing.dynalite import Dynalite

pytestmark = pytest.mark.dynamodb

T = TableRef("robots", "episodes")


@pytest.fixture
def registry(dynamo_registry: DynamoRegistry) -> DynamoRegistry:
    return dynamo_registry


async def table_at_version_2(registry: DynamoRegistry) -> tuple[TableRecord, list[str]]:
    await registry.create_table(
        TableRecord(
            table=T,
            incarnation="inc-1",
            location="s3://bucket/robots/episodes.lance",
            engine="lance",
            schema_ipc=schema_to_ipc(pa.schema([("a", pa.int64())])),
            version=0,
            engine_version=1,
            created_at_ms=1,
        )
    )
    ops = []
    for expected in (0, 1):
        op = new_operation_id()
        ops.append(op)
        await registry.commit_append(
            AppendCommit(
                T, "inc-1", expected, expected + 2, op, operation_time_ms(op), 10 + expected
            )
        )
    record = await registry.get_table(T)
    assert record is not None
    assert (record.version, record.engine_version) == (2, 3)
    return record, ops


@pytest.mark.asyncio
async def test_maintenance_moves_the_engine_version_and_its_history_row(
    registry: DynamoRegistry,
) -> None:
    _record, ops = await table_at_version_2(registry)
    generation = await registry.generation()

    updated = await registry.commit_maintenance(MaintenanceCommit(T, "inc-1", 2, 3, 7))

    assert (updated.version, updated.engine_version) == (2, 7)
    assert await registry.get_table(T) == updated
    assert await registry.generation() != generation
    history = await registry.versions("inc-1")
    assert [(v.version, v.engine_version, v.operation_id) for v in history] == [
        (0, 1, None),
        (1, 2, ops[0]),
        (2, 7, ops[1]),
    ]
    assert history[2].committed_at_ms == 11  # the Lake version's commit time is kept
    # The append that made version 2 still resolves to it (a retry is a replay).
    operation = await registry.get_operation(ops[1])
    assert operation is not None
    assert operation.version == 2
    # And the next append builds on the new Lance version, gap-free.
    op = new_operation_id()
    after = await registry.commit_append(
        AppendCommit(T, "inc-1", 2, 8, op, operation_time_ms(op), 20)
    )
    assert (after.version, after.engine_version) == (3, 8)


@pytest.mark.asyncio
async def test_maintenance_is_refused_when_the_table_moved_on(registry: DynamoRegistry) -> None:
    record, _ = await table_at_version_2(registry)
    commit = MaintenanceCommit(T, "inc-1", 2, 3, 7)
    with pytest.raises(StaleReadVersion):
        await registry.commit_maintenance(replace(commit, expected_engine_version=2))
    with pytest.raises(StaleReadVersion):
        await registry.commit_maintenance(replace(commit, expected_version=1))
    with pytest.raises(TableNotFound):
        await registry.commit_maintenance(replace(commit, incarnation="inc-0"))
    with pytest.raises(TableNotFound):
        await registry.commit_maintenance(replace(commit, table=TableRef("robots", "other")))
    assert await registry.get_table(T) == record
    # A duplicate delivery of a maintenance that landed is answered, not refused.
    first = await registry.commit_maintenance(commit)
    assert await registry.commit_maintenance(commit) == first


@pytest.mark.asyncio
async def test_a_fenced_leaders_maintenance_does_not_land(
    dynalite: Dynalite, registry: DynamoRegistry
) -> None:
    record, _ = await table_at_version_2(registry)
    newer = DynamoRegistry(
        registry.table,
        endpoint_url=dynalite.endpoint,
        region=dynalite.region,
        fence=lambda: 5,
        provision=False,
    )
    await newer.open()
    try:
        assert await newer.take_authority(5) == 1
    finally:
        await newer.close()
    with pytest.raises(NotLeader):
        await registry.commit_maintenance(MaintenanceCommit(T, "inc-1", 2, 3, 7))
    current = await registry.get_table(T)
    assert current is not None
    assert current.engine_version == record.engine_version
