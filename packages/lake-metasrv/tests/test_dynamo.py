"""DynamoRegistry beyond the shared RegistryStore tests: fencing, crash recovery, snapshots.

Runs against dynalite (a real, independent DynamoDB implementation).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from lake_core.errors import FailedPrecondition, ResourceExhausted, StaleReadVersion
from lake_core.ids import new_operation_id, operation_time_ms
from lake_core.names import TableRef
from lake_core.schemas import schema_to_ipc
from lake_metasrv.registry import dynamo
from lake_metasrv.registry import dynamo_layout as layout
from lake_metasrv.registry.base import AppendCommit, TableRecord
from lake_metasrv.registry.dynamo import DynamoRegistry, NotLeader
from tools.lake_testing.dynalite import Dynalite

pytestmark = pytest.mark.dynamodb

T = TableRef("robots", "episodes")
SCHEMA = pa.schema([("a", pa.int64())])


@pytest.fixture
def table_name(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dynalite")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dynalite")
    return f"reg_{uuid.uuid4().hex[:10]}"


def store(server: Dynalite, name: str, **kwargs: Any) -> DynamoRegistry:
    return DynamoRegistry(name, endpoint_url=server.endpoint, region=server.region, **kwargs)


@pytest_asyncio.fixture
async def registry(dynalite: Dynalite, table_name: str) -> AsyncIterator[DynamoRegistry]:
    opened = store(dynalite, table_name)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def record(incarnation: str = "inc-1", table: TableRef = T) -> TableRecord:
    return TableRecord(
        table=table,
        incarnation=incarnation,
        location=f"s3://bucket/{table.namespace}/{table.name}.lance",
        engine="lance",
        schema_ipc=schema_to_ipc(SCHEMA),
        version=0,
        engine_version=1,
        created_at_ms=1,
    )


def commit(expected: int, engine_version: int, op: str | None = None) -> AppendCommit:
    op = op or new_operation_id()
    return AppendCommit(
        table=T,
        incarnation="inc-1",
        expected_version=expected,
        engine_version=engine_version,
        operation_id=op,
        operation_time_ms=operation_time_ms(op),
        committed_at_ms=2,
    )


@pytest.mark.asyncio
async def test_a_newer_epoch_fences_an_older_writer(dynalite: Dynalite, table_name: str) -> None:
    epochs = {"old": 1, "new": 2}
    old = store(dynalite, table_name, fence=lambda: epochs["old"])
    new = store(dynalite, table_name, fence=lambda: epochs["new"])
    await old.open()
    await new.open()
    try:
        await old.take_authority(1)
        await old.create_table(record())
        await old.commit_append(commit(expected=0, engine_version=2))
        assert await new.take_authority(2) == 1  # every head now carries epoch 2
        with pytest.raises(NotLeader, match="fenced"):
            await old.commit_append(commit(expected=1, engine_version=3))
        with pytest.raises(NotLeader):
            await old.drop_table(T, "inc-1", dropped_at_ms=3)
        # The authority only moves forward.
        with pytest.raises(NotLeader):
            await old.take_authority(2)
        moved = await new.commit_append(commit(expected=1, engine_version=3))
        assert moved.version == 2
    finally:
        await old.close()
        await new.close()


async def _raw_head_update(registry: DynamoRegistry, op: str, version: int, engine: int) -> None:
    """Step 2 of a commit, alone: what a crash right after the visibility point leaves."""
    await registry.client.update_item(
        TableName=registry.table,
        Key=layout.dir_key(T),
        UpdateExpression="SET ver = :v, ever = :e, last_op = :op, last_at = :at",
        ExpressionAttributeValues={
            ":v": {"N": str(version)},
            ":e": {"N": str(engine)},
            ":op": {"S": op},
            ":at": {"N": "7"},
        },
    )


async def _raw_pending(registry: DynamoRegistry, op: str, version: int, engine: int) -> None:
    await registry.client.put_item(
        TableName=registry.table,
        Item={
            **layout.op_key(op),
            **layout.encode(
                {
                    "st": "pending",
                    "ns": T.namespace,
                    "name": T.name,
                    "inc": "inc-1",
                    "ver": version,
                    "ever": engine,
                    "op_time": operation_time_ms(op),
                    "at": 7,
                }
            ),
        },
    )


@pytest.mark.asyncio
async def test_crash_after_the_visibility_point_replays_the_original_version(
    registry: DynamoRegistry, dynalite: Dynalite, table_name: str
) -> None:
    await registry.create_table(record())
    op = new_operation_id()
    await _raw_pending(registry, op, 1, 5)
    await _raw_head_update(registry, op, 1, 5)

    # A fresh process (a new leader) finds the operation committed at version 1.
    fresh = store(dynalite, table_name, fence=lambda: 1)
    await fresh.open()
    try:
        replay = await fresh.get_operation(op)
        assert replay is not None
        assert (replay.version, replay.engine_version, replay.location) == (1, 5, record().location)
        await fresh.take_authority(1)  # repairs the head's version record
        history = await fresh.versions("inc-1")
        assert [(v.version, v.engine_version, v.operation_id) for v in history] == [
            (0, 1, None),
            (1, 5, op),
        ]
        moved = await fresh.commit_append(commit(expected=1, engine_version=6))
        assert moved.version == 2
        # Still resolvable after the head moved on: from the version record.
        assert (await fresh.get_operation(op)).version == 1  # type: ignore[union-attr]
    finally:
        await fresh.close()


@pytest.mark.asyncio
async def test_a_group_crashed_after_the_visibility_point_resolves_whole(
    registry: DynamoRegistry, dynalite: Dynalite, table_name: str
) -> None:
    # Step 1 for every append of a group, then the one head update naming them all.
    await registry.create_table(record())
    group = [new_operation_id() for _ in range(3)]
    for op in group:
        await _raw_pending(registry, op, 1, 5)
    await _raw_head_update(registry, ",".join(group), 1, 5)
    stray = new_operation_id()
    await _raw_pending(registry, stray, 1, 5)  # pending for the same version, not named

    fresh = store(dynalite, table_name, fence=lambda: 1)
    await fresh.open()
    try:
        found = await fresh.get_operations([*group, stray])
        assert sorted(found) == sorted(group)
        assert {(r.version, r.engine_version) for r in found.values()} == {(1, 5)}
        await fresh.take_authority(1)
        history = await fresh.versions("inc-1")
        assert [(v.version, v.operation_ids) for v in history] == [(0, ()), (1, tuple(group))]
        await fresh.commit_append(commit(expected=1, engine_version=6))
        # Still resolvable from the version record once the head moved on.
        for op in group:
            assert (await fresh.get_operation(op)).version == 1  # type: ignore[union-attr]
        assert await fresh.get_operation(stray) is None
    finally:
        await fresh.close()


@pytest.mark.asyncio
async def test_crash_before_the_visibility_point_leaves_nothing_committed(
    registry: DynamoRegistry,
) -> None:
    await registry.create_table(record())
    op = new_operation_id()
    await _raw_pending(registry, op, 1, 5)  # step 1 only
    assert await registry.get_operation(op) is None
    # The retry commits normally, once.
    moved = await registry.commit_append(commit(expected=0, engine_version=6, op=op))
    assert (moved.version, moved.engine_version) == (1, 6)
    replay = await registry.get_operation(op)
    assert replay is not None
    assert (replay.version, replay.engine_version) == (1, 6)
    with pytest.raises(StaleReadVersion):
        await registry.commit_append(commit(expected=0, engine_version=7))


@pytest.mark.asyncio
async def test_a_lost_reply_of_our_own_head_write_counts_as_committed(
    registry: DynamoRegistry,
) -> None:
    await registry.create_table(record())
    op = new_operation_id()
    await _raw_head_update(registry, op, 1, 5)  # our write landed, the reply was lost
    landed = await registry.commit_append(commit(expected=0, engine_version=9, op=op))
    assert (landed.version, landed.engine_version) == (1, 5)


@pytest.mark.asyncio
async def test_snapshots_fail_closed_without_the_authority_marker(
    registry: DynamoRegistry, dynalite: Dynalite, table_name: str
) -> None:
    await registry.create_table(record())
    await registry.client.delete_item(
        TableName=registry.table, Key=layout.item_key(layout.META, "authority")
    )
    with pytest.raises(FailedPrecondition, match="authority marker"):
        await registry.snapshot()
    # A non-empty directory without its marker is never re-initialized silently.
    reopened = store(dynalite, table_name)
    await reopened.open()
    try:
        with pytest.raises(FailedPrecondition):
            await reopened.snapshot_if_changed(None)
    finally:
        await reopened.close()


@pytest.mark.asyncio
async def test_snapshot_accounts_each_entry_against_its_budget(
    registry: DynamoRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(5):
        await registry.create_table(record(f"inc-{i}", TableRef("fleet", f"t{i}")))
    monkeypatch.setattr(dynamo, "MAX_SNAPSHOT_BYTES", 1000)
    with pytest.raises(ResourceExhausted):
        await registry.snapshot()


@pytest.mark.asyncio
async def test_one_full_snapshot_at_a_time(
    registry: DynamoRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    await registry.create_table(record())
    running = 0
    most = 0
    scan = registry._scan_directory

    async def counted() -> list[TableRecord]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.05)
            return await scan()
        finally:
            running -= 1

    monkeypatch.setattr(registry, "_scan_directory", counted)
    results = await asyncio.gather(*(registry.snapshot_if_changed(None) for _ in range(4)))
    assert most == 1
    assert all(tables is not None and len(tables) == 1 for _, tables in results)


@pytest.mark.asyncio
async def test_prune_removes_old_operations_in_every_shard(registry: DynamoRegistry) -> None:
    await registry.create_table(record())
    ops = [new_operation_id() for _ in range(20)]
    for i, op in enumerate(ops):
        await registry.commit_append(commit(expected=i, engine_version=i + 2, op=op))
    horizon = operation_time_ms(ops[-1]) + 1
    assert await registry.prune_operations(horizon) == 20
    assert all([await registry.get_operation(op) is None for op in ops])
    assert len(await registry.versions("inc-1")) == 21


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(4))
async def test_batched_operation_reads_answer_as_one_read_each(
    registry: DynamoRegistry, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """get_operations (BatchGetItem) against get_operation per id, over generated histories.

    Each id is committed, pending and never committed, or unknown, and odd
    seeds end on a crash after the visibility point (pending, resolved by the
    head); the id lists
    repeat ids and exceed one BatchGetItem page (shrunk to 5 keys here).
    """
    import random

    from lake_metasrv.registry import dynamo_table

    monkeypatch.setattr(dynamo_table, "BATCH_GET_KEYS", 5)
    rng = random.Random(seed)
    await registry.create_table(record())
    version, ids, committed = 0, [], set()
    for _ in range(rng.randint(6, 14)):
        op, kind = new_operation_id(), rng.choice(["committed", "pending", "unknown"])
        if kind == "committed":
            await registry.commit_append(
                commit(expected=version, engine_version=version + 2, op=op)
            )
            version += 1
        elif kind == "pending":
            await _raw_pending(registry, op, version + 1, version + 2)
        ids.append(op)
    if seed % 2:
        # A crash right after the visibility point: only the head names it.
        op = new_operation_id()
        await _raw_pending(registry, op, version + 1, version + 2)
        await _raw_head_update(registry, op, version + 1, version + 2)
        ids.append(op)
    asked = ids + rng.sample(ids, k=min(3, len(ids)))
    rng.shuffle(asked)
    one_by_one = {i: r for i in asked if (r := await registry.get_operation(i)) is not None}
    assert await registry.get_operations(asked) == one_by_one
    assert (ids[-1] in one_by_one) == (seed % 2 == 1 or ids[-1] in committed)
    assert await registry.get_operations([]) == {}


@pytest.mark.asyncio
async def test_commits_of_many_tables_share_their_post_commit_writes(
    registry: DynamoRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight tables commit at once: their records and generation bumps go in shared requests.

    The first generation bump is held until every head moved, so the other
    seven commits all wait for the one flush after it. Each commit still
    returns only once its own records are written and the generation moved.
    """
    tables = [TableRef("fleet", f"t{i}") for i in range(8)]
    for i, table in enumerate(tables):
        await registry.create_table(record(f"inc-{i}", table))
    client = registry.client
    update, batch_write = client.update_item, client.batch_write_item
    heads_moved, all_moved = 0, asyncio.Event()
    bumps = writes = 0

    async def counted_update(**kwargs: Any) -> Any:
        nonlocal heads_moved, bumps
        if kwargs["UpdateExpression"].startswith("ADD n"):
            bumps += 1
            await asyncio.wait_for(all_moved.wait(), 30)
            return await update(**kwargs)
        reply = await update(**kwargs)
        heads_moved += 1
        if heads_moved == len(tables):
            all_moved.set()
        return reply

    async def counted_batch_write(**kwargs: Any) -> Any:
        nonlocal writes
        writes += 1
        return await batch_write(**kwargs)

    monkeypatch.setattr(client, "update_item", counted_update)
    monkeypatch.setattr(client, "batch_write_item", counted_batch_write)

    async def append(i: int, table: TableRef) -> str:
        op = new_operation_id()
        before = await registry.generation()
        head = await registry.commit_append(
            AppendCommit(
                table=table,
                incarnation=f"inc-{i}",
                expected_version=0,
                engine_version=2,
                operation_id=op,
                operation_time_ms=operation_time_ms(op),
                committed_at_ms=2,
            )
        )
        assert head.version == 1
        # Written before the commit returned: the operation record and the version record.
        raw = await client.get_item(
            TableName=registry.table, Key=layout.op_key(op), ConsistentRead=True
        )
        assert raw["Item"]["st"] == {"S": "committed"}
        assert [v.operation_ids for v in await registry.versions(f"inc-{i}")] == [(), (op,)]
        assert await registry.generation() != before
        return op

    ops = await asyncio.gather(*(append(i, t) for i, t in enumerate(tables)))
    assert len(set(ops)) == len(tables)
    assert (bumps, writes) == (2, 2)
    assert not registry._unsynced


@pytest.mark.asyncio
async def test_a_failed_flush_is_logged_and_the_next_commit_writes_what_it_owed(
    registry: DynamoRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush that fails outside DynamoDB (a bug) neither hangs nor loses the commit's records."""
    await registry.create_table(record())
    real, calls = dynamo.version_item, 0

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("building the version record failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(dynamo, "version_item", fails_once)
    first = new_operation_id()
    with capture_logs() as logs:
        head = await asyncio.wait_for(registry.commit_append(commit(0, 2, first)), 30)
    assert head.version == 1  # the head moved: committed, whatever the flush did
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == [
        "post-commit registry flush failed; retried before the next write"
    ]
    assert "building the version record failed" in warnings[0]["error"]
    assert T in registry._unsynced

    second = new_operation_id()
    assert (await registry.commit_append(commit(1, 3, second))).version == 2
    assert not registry._unsynced
    assert [v.operation_ids for v in await registry.versions("inc-1")] == [
        (),
        (first,),
        (second,),
    ]
    for op in (first, second):
        raw = await registry.client.get_item(
            TableName=registry.table, Key=layout.op_key(op), ConsistentRead=True
        )
        assert raw["Item"]["st"] == {"S": "committed"}
