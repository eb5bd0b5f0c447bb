"""The commit coordinator: validation, replay, read versions, sidecars, concurrency."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest

from lake_core.errors import (
    InvalidAppend,
    OperationExpired,
    SchemaMismatch,
    StaleReadVersion,
    TableExists,
    TableNotFound,
)
from lake_core.filetype import FILE_STRUCT
from lake_core.ids import new_operation_id
from lake_core.names import TableRef
from lake_core.protocol import AppendCommand
from lake_metasrv.commits import CommitCoordinator


def uuid7_at(ms: int) -> str:
    """A UUIDv7 stamped at ``ms`` (Unix milliseconds)."""
    value = (ms << 80) | (0x7 << 76) | (0b10 << 62) | 12345
    return str(uuid.UUID(int=value))


def command(kit: Any, op: str | None = None, **fields: Any) -> AppendCommand:
    return AppendCommand(table=kit.episodes, operation_id=op or new_operation_id(), **fields)


async def current_version(coord: CommitCoordinator, kit: Any) -> int:
    return (await coord.describe_table(kit.episodes)).version


@pytest.mark.asyncio
async def test_create_twice_is_table_exists(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    with pytest.raises(TableExists):
        await coordinator.create_table(kit.episodes, kit.schema)


@pytest.mark.asyncio
async def test_append_returns_gap_free_versions(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    versions = []
    for i in range(3):
        result = await coordinator.append(command(kit), kit.schema, [kit.make_batch(2, i * 2)])
        assert not result.replayed
        assert result.descriptor.version == result.version
        versions.append(result.version)
    assert versions == [1, 2, 3]


@pytest.mark.asyncio
async def test_replay_returns_the_original_result(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    op = new_operation_id()
    first = await coordinator.append(command(kit, op), kit.schema, [kit.make_batch(3)])
    await coordinator.append(command(kit), kit.schema, [kit.make_batch(1, 100)])
    again = await coordinator.append(command(kit, op), kit.schema, [kit.make_batch(3)])
    assert again.replayed
    assert again.version == first.version == 1
    assert again.descriptor == first.descriptor
    assert await current_version(coordinator, kit) == 2
    # A replay even wins over a read_version that has since moved.
    stale = command(kit, op, read_version=0)
    assert (await coordinator.append(stale, kit.schema, [kit.make_batch(3)])).version == 1


@pytest.mark.asyncio
async def test_same_operation_id_for_another_table(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    other = TableRef("robots", "other")
    await coordinator.create_table(kit.episodes, kit.schema)
    await coordinator.create_table(other, kit.schema)
    op = new_operation_id()
    await coordinator.append(command(kit, op), kit.schema, [kit.make_batch(1)])
    with pytest.raises(InvalidAppend, match="another table"):
        await coordinator.append(
            AppendCommand(table=other, operation_id=op), kit.schema, [kit.make_batch(1)]
        )
    assert (await coordinator.describe_table(other)).version == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "op",
    [
        str(uuid.uuid4()),
        "not-a-uuid",
        new_operation_id().upper(),
    ],
)
async def test_operation_id_must_be_uuid7(
    coordinator: CommitCoordinator, kit: Any, op: str
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    with pytest.raises(InvalidAppend):
        await coordinator.append(command(kit, op), kit.schema, [kit.make_batch(1)])
    assert await current_version(coordinator, kit) == 0


@pytest.mark.asyncio
async def test_expired_operation_id(make_coordinator: Any, kit: Any) -> None:
    coord = make_coordinator(operation_retention_secs=60)
    await coord.open()
    try:
        await coord.create_table(kit.episodes, kit.schema)
        old = uuid7_at(int(time.time() * 1000) - 120_000)
        with pytest.raises(OperationExpired) as info:
            await coord.append(command(kit, old), kit.schema, [kit.make_batch(1)])
        assert info.value.grpc_status.name == "FAILED_PRECONDITION"
        future = uuid7_at(int(time.time() * 1000) + 3 * 24 * 3600 * 1000)
        with pytest.raises(InvalidAppend, match="future"):
            await coord.append(command(kit, future), kit.schema, [kit.make_batch(1)])
        recent = uuid7_at(int(time.time() * 1000) - 30_000)
        assert (await coord.append(command(kit, recent), kit.schema, [kit.make_batch(1)])).version
    finally:
        await coord.close()


@pytest.mark.asyncio
async def test_expired_ids_are_pruned_on_open(make_coordinator: Any, kit: Any) -> None:
    coord = make_coordinator()
    await coord.open()
    await coord.create_table(kit.episodes, kit.schema)
    op = uuid7_at(int(time.time() * 1000) - 10_000)
    await coord.append(command(kit, op), kit.schema, [kit.make_batch(1)])
    await coord.close()
    short = make_coordinator(operation_retention_secs=5)
    await short.open()
    try:
        assert await short.registry.get_operation(op) is None
        with pytest.raises(OperationExpired):
            await short.append(command(kit, op), kit.schema, [kit.make_batch(1)])
    finally:
        await short.close()


@pytest.mark.asyncio
async def test_bad_shapes_write_nothing(coordinator: CommitCoordinator, kit: Any) -> None:
    record = await coordinator.create_table(kit.episodes, kit.schema)
    empty = kit.make_batch(0)
    cases: list[tuple[list[pa.RecordBatch], str]] = [
        ([], "at least one row"),
        ([empty], "empty"),
        ([kit.make_batch(2), empty], "empty"),
        ([kit.make_batch(10_001)], "at most 10000"),
        ([kit.make_batch(5_000), kit.make_batch(5_001, 5_000)], "at most 10000"),
    ]
    for batches, message in cases:
        with pytest.raises(InvalidAppend, match=message):
            await coordinator.append(command(kit), kit.schema, batches)
    assert await current_version(coordinator, kit) == 0
    assert not coordinator.sidecars.path(record.incarnation, 1).exists()
    big = [kit.make_batch(6_000), kit.make_batch(4_000, 6_000)]
    assert (await coordinator.append(command(kit), kit.schema, big)).version == 1


@pytest.mark.asyncio
async def test_schema_must_match_exactly(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    wrong = [
        pa.schema([("episode_id", pa.utf8()), ("reward", pa.float32())]),
        pa.schema([("reward", pa.float64()), ("episode_id", pa.utf8())]),
        pa.schema([("episode_id", pa.utf8())]),
        pa.schema([pa.field("episode_id", pa.utf8(), nullable=False), ("reward", pa.float64())]),
    ]
    for schema in wrong:
        batch = pa.RecordBatch.from_pylist([{"episode_id": "x", "reward": 1.0}][:1], schema=schema)
        with pytest.raises(SchemaMismatch):
            await coordinator.append(command(kit), schema, [batch])
    assert await current_version(coordinator, kit) == 0
    # Schema-level metadata (pandas adds some) is not part of the contract.
    tagged = kit.schema.with_metadata({"pandas": "{}"})
    batch = kit.make_batch(1).replace_schema_metadata({"pandas": "{}"})
    assert (await coordinator.append(command(kit), tagged, [batch])).version == 1


@pytest.mark.asyncio
async def test_read_version(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    ok = await coordinator.append(command(kit, read_version=0), kit.schema, [kit.make_batch(1)])
    assert ok.version == 1
    with pytest.raises(StaleReadVersion):
        await coordinator.append(command(kit, read_version=0), kit.schema, [kit.make_batch(1)])
    assert await current_version(coordinator, kit) == 1


@pytest.mark.asyncio
async def test_missing_table(coordinator: CommitCoordinator, kit: Any) -> None:
    with pytest.raises(TableNotFound):
        await coordinator.append(command(kit), kit.schema, [kit.make_batch(1)])


@pytest.mark.asyncio
async def test_sidecar_lists_file_uris_before_commit(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    record = await coordinator.create_table(kit.episodes, kit.file_schema)
    assert coordinator.sidecars.read_delta(record.incarnation, 0).adds == []
    batch = kit.make_batch(3, schema=kit.file_schema)
    op = new_operation_id()
    result = await coordinator.append(command(kit, op), kit.file_schema, [batch])
    delta = coordinator.sidecars.read_delta(record.incarnation, result.version)
    assert delta.operation_id == op
    assert delta.adds == sorted(f"file:///stage/tenants/local/v{i}.mp4" for i in range(3))
    raw = json.loads(coordinator.sidecars.path(record.incarnation, 1).read_text())
    assert raw["schema_version"] == 1


@pytest.mark.asyncio
async def test_malformed_file_cell_is_refused(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.file_schema)
    bad = pa.array(
        [{"uri": "file:///x", "media_type": "video/mp4", "size_bytes": 1, "sha256": "nope"}],
        FILE_STRUCT,
    )
    batch = pa.record_batch([pa.array(["e"]), bad], schema=kit.file_schema)
    with pytest.raises(InvalidAppend, match="sha256"):
        await coordinator.append(command(kit), kit.file_schema, [batch])
    # The SDK refuses such media types on upload; an append was not checked the same way.
    for media_type in ("no slash\x00", "video/", "video/mp4; codecs=avc1", "a" * 128 + "/b"):
        cell = {"uri": "file:///x", "media_type": media_type, "size_bytes": 1, "sha256": "0" * 64}
        odd = pa.record_batch([pa.array(["e"]), pa.array([cell], FILE_STRUCT)], kit.file_schema)
        with pytest.raises(InvalidAppend, match="media_type"):
            await coordinator.append(command(kit), kit.file_schema, [odd])
    nulls = pa.record_batch(
        [pa.array(["e"]), pa.array([None], FILE_STRUCT)], schema=kit.file_schema
    )
    assert (await coordinator.append(command(kit), kit.file_schema, [nulls])).version == 1


@pytest.mark.asyncio
async def test_concurrent_appends_share_versions(coordinator: CommitCoordinator, kit: Any) -> None:
    # The contract changed with commit groups: concurrent appends share a
    # version (it was one version each). Versions stay gap-free, every
    # append's rows appear exactly once, and each version names its appends.
    await coordinator.create_table(kit.episodes, kit.schema)
    commands = [command(kit) for _ in range(12)]
    results = await asyncio.gather(
        *(coordinator.append(c, kit.schema, [kit.make_batch(1, i)]) for i, c in enumerate(commands))
    )
    record = await coordinator.describe_table(kit.episodes)
    versions = {r.version for r in results}
    assert versions == set(range(1, record.version + 1))
    assert record.version < 12  # grouped: fewer versions than appends
    table = await coordinator.engine.read(record.location, record.engine_version)
    assert sorted(table.column("episode_id").to_pylist()) == sorted(f"ep-{i}" for i in range(12))
    history = await coordinator.registry.versions(record.incarnation)
    held = {v.version: set(v.operation_ids) for v in history if v.version > 0}
    assert held == {
        v: {c.operation_id for c, r in zip(commands, results, strict=True) if r.version == v}
        for v in versions
    }
    # One Lance version per group: Lance version 1 is the create.
    assert record.engine_version == record.version + 1


@pytest.mark.asyncio
async def test_cancelled_caller_does_not_abandon_the_commit(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    op = new_operation_id()
    task = asyncio.create_task(
        coordinator.append(command(kit, op), kit.schema, [kit.make_batch(2)])
    )
    for _ in range(10_000):  # until the shielded commit task exists
        if coordinator._tasks:
            break
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await coordinator.drain(30)
    assert await current_version(coordinator, kit) == 1
    replay = await coordinator.append(command(kit, op), kit.schema, [kit.make_batch(2)])
    assert replay.replayed
    assert replay.version == 1


@pytest.mark.asyncio
async def test_appends_follow_a_table_recreated_behind_this_coordinators_back(
    make_coordinator: Any, kit: Any
) -> None:
    # Two coordinators on one registry and data directory, as two leadership
    # terms would be: the first keeps what it last saw of the table, the
    # second drops it and recreates it with another schema.
    first, second = make_coordinator(), make_coordinator()
    await first.open()
    await second.open()
    try:
        await first.create_table(kit.episodes, kit.schema)
        assert (await first.append(command(kit), kit.schema, [kit.make_batch(2)])).version == 1
        await second.drop_table(kit.episodes)
        recreated = await second.create_table(kit.episodes, kit.file_schema)

        with pytest.raises(SchemaMismatch):  # the old schema, which `first` last saw
            await first.append(command(kit), kit.schema, [kit.make_batch(1)])
        result = await first.append(
            command(kit), kit.file_schema, [kit.make_batch(3, schema=kit.file_schema)]
        )
        assert result.version == 1
        assert result.descriptor.incarnation == recreated.incarnation
        table = await first.engine.read(recreated.location, result.descriptor.engine_version)
        assert table.schema.names == kit.file_schema.names
        assert table.num_rows == 3
    finally:
        await first.close()
        await second.close()
