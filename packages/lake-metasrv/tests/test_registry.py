"""RegistryStore semantics, run against both stores: SQLite and DynamoDB (dynalite).

The shared tests only use the ABC; each store gets a ``Factory`` that opens a
store at a named place (a file, or a DynamoDB table) so reopening is tested too.
DynamoDB-only behaviour (fencing, crash recovery, snapshots) is in test_dynamo.py.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pyarrow as pa
import pytest
import pytest_asyncio

from lake_core.errors import InvalidAppend, StaleReadVersion, TableExists, TableNotFound
from lake_core.ids import new_operation_id, operation_time_ms
from lake_core.names import TableRef
from lake_core.schemas import schema_to_ipc
from lake_metasrv.registry import AppendCommit, RegistryStore, SqliteRegistry, TableRecord
from lake_metasrv.registry.base import AppendOperation
from lake_metasrv.registry.dynamo import DynamoRegistry
from tools.lake_testing.dynalite import Dynalite

T = TableRef("robots", "episodes")
SCHEMA = pa.schema([("a", pa.int64())])


def record(table: TableRef = T, incarnation: str = "inc-1") -> TableRecord:
    return TableRecord(
        table=table,
        incarnation=incarnation,
        location=f"/data/tables/{table.namespace}/{table.name}.lance",
        engine="lance",
        schema_ipc=schema_to_ipc(SCHEMA),
        version=0,
        engine_version=1,
        created_at_ms=1,
    )


def commit(
    expected: int, engine_version: int, op: str | None = None, incarnation: str = "inc-1"
) -> AppendCommit:
    op = op or new_operation_id()
    return AppendCommit(
        table=T,
        incarnation=incarnation,
        expected_version=expected,
        engine_version=engine_version,
        operation_id=op,
        operation_time_ms=operation_time_ms(op),
        committed_at_ms=2,
    )


Factory = Callable[[str], RegistryStore]


@pytest.fixture(params=["sqlite", pytest.param("dynamodb", marks=pytest.mark.dynamodb)])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """``make_store(name)`` opens the store called ``name`` (same name: same store)."""
    if request.param == "sqlite":
        return lambda name: SqliteRegistry(tmp_path / f"{name}.sqlite3")
    server: Dynalite = request.getfixturevalue("dynalite")
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    # dynalite ignores credentials, but botocore insists on having some.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dynalite")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dynalite")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    return lambda name: DynamoRegistry(
        f"{prefix}_{name}", endpoint_url=server.endpoint, region=server.region
    )


@pytest_asyncio.fixture
async def registry(make_store: Factory) -> AsyncIterator[RegistryStore]:
    store = make_store("registry")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_sqlite_is_wal_with_full_sync(tmp_path: Path) -> None:
    store = SqliteRegistry(tmp_path / "r.sqlite3")
    await store.open()
    await store.close()
    conn = sqlite3.connect(tmp_path / "r.sqlite3")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    # synchronous is per connection: check the store's own connection.
    store = SqliteRegistry(tmp_path / "r.sqlite3")
    await store.open()
    assert store._conn is not None
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    await store.close()


@pytest.mark.asyncio
async def test_create_get_and_exists(registry: RegistryStore) -> None:
    assert await registry.get_table(T) is None
    await registry.create_table(record())
    got = await registry.get_table(T)
    assert got == record()
    assert got.schema.equals(SCHEMA)
    with pytest.raises(TableExists):
        await registry.create_table(record(incarnation="inc-2"))
    versions = await registry.versions("inc-1")
    assert [(v.version, v.engine_version) for v in versions] == [(0, 1)]


@pytest.mark.asyncio
async def test_cas_moves_one_version_at_a_time(registry: RegistryStore) -> None:
    await registry.create_table(record())
    first = await registry.commit_append(commit(expected=0, engine_version=2))
    assert (first.version, first.engine_version) == (1, 2)
    # Engine versions may skip (a restored orphan); Lake versions may not.
    second = await registry.commit_append(commit(expected=1, engine_version=5))
    assert (second.version, second.engine_version) == (2, 5)
    with pytest.raises(StaleReadVersion):
        await registry.commit_append(commit(expected=1, engine_version=6))
    current = await registry.get_table(T)
    assert current is not None
    assert (current.version, current.engine_version) == (2, 5)
    history = await registry.versions("inc-1")
    assert [(v.version, v.engine_version) for v in history] == [(0, 1), (1, 2), (2, 5)]


@pytest.mark.asyncio
async def test_failed_cas_changes_nothing(registry: RegistryStore) -> None:
    await registry.create_table(record())
    gen = await registry.generation()
    op = new_operation_id()
    with pytest.raises(StaleReadVersion):
        await registry.commit_append(commit(expected=3, engine_version=2, op=op))
    assert await registry.generation() == gen
    assert await registry.get_operation(op) is None
    assert len(await registry.versions("inc-1")) == 1


def group(expected: int, engine_version: int, ops: list[str]) -> AppendCommit:
    return AppendCommit.of_group(
        T,
        "inc-1",
        expected,
        engine_version,
        [AppendOperation(op, operation_time_ms(op)) for op in ops],
        committed_at_ms=3,
    )


@pytest.mark.asyncio
async def test_a_commit_group_is_one_version_holding_every_operation(
    registry: RegistryStore,
) -> None:
    await registry.create_table(record())
    ops = [new_operation_id() for _ in range(5)]
    head = await registry.commit_append(group(0, 2, ops))
    assert (head.version, head.engine_version) == (1, 2)
    found = await registry.get_operations(ops)
    assert sorted(found) == sorted(ops)
    for op in ops:
        assert (found[op].version, found[op].engine_version) == (1, 2)
        single = await registry.get_operation(op)
        assert single is not None
        assert single.result(replayed=True).version == 1
    history = await registry.versions("inc-1")
    assert [(v.version, v.operation_ids) for v in history] == [(0, ()), (1, tuple(ops))]
    assert history[1].operation_id == ops[0]
    # A group's first read: the table and which of its ids committed, together.
    other = TableRef("robots", "absent")
    stranger = new_operation_id()
    table, committed = await registry.get_table_and_operations(T, [ops[0], stranger, ops[1]])
    assert table == head
    assert sorted(committed) == sorted(ops[:2])
    assert await registry.get_table_and_operations(other, [stranger]) == (None, {})


@pytest.mark.asyncio
async def test_a_group_with_a_committed_operation_commits_none_of_it(
    registry: RegistryStore,
) -> None:
    await registry.create_table(record())
    done = new_operation_id()
    await registry.commit_append(commit(expected=0, engine_version=2, op=done))
    gen = await registry.generation()
    fresh = [new_operation_id() for _ in range(3)]
    with pytest.raises(InvalidAppend, match="already committed"):
        await registry.commit_append(group(1, 3, [*fresh, done]))
    with pytest.raises(InvalidAppend):
        await registry.commit_append(group(1, 3, [fresh[0], fresh[0]]))
    assert await registry.generation() == gen
    assert await registry.get_operations(fresh) == {}
    current = await registry.get_table(T)
    assert current is not None
    assert current.version == 1
    # The same fresh ids then commit, all together, at the next version.
    head = await registry.commit_append(group(1, 3, fresh))
    assert head.version == 2
    assert {r.version for r in (await registry.get_operations(fresh)).values()} == {2}


@pytest.mark.asyncio
async def test_operation_id_commits_once_and_replays(registry: RegistryStore) -> None:
    await registry.create_table(record())
    op = new_operation_id()
    await registry.commit_append(commit(expected=0, engine_version=2, op=op))
    with pytest.raises(InvalidAppend, match="already committed"):
        await registry.commit_append(commit(expected=1, engine_version=3, op=op))
    remembered = await registry.get_operation(op)
    assert remembered is not None
    assert (remembered.table, remembered.version, remembered.engine_version) == (T, 1, 2)
    result = remembered.result(replayed=True)
    assert result.replayed
    assert result.version == 1
    assert result.descriptor.incarnation == "inc-1"
    assert result.descriptor.engine_version == 2
    table = await registry.get_table(T)
    assert table is not None
    assert table.version == 1


@pytest.mark.asyncio
async def test_commit_against_dropped_or_recreated_table(registry: RegistryStore) -> None:
    await registry.create_table(record())
    await registry.drop_table(T, "inc-1", dropped_at_ms=5)
    with pytest.raises(TableNotFound):
        await registry.commit_append(commit(expected=0, engine_version=2))
    await registry.create_table(record(incarnation="inc-2"))
    with pytest.raises(TableNotFound):
        await registry.commit_append(commit(expected=0, engine_version=2, incarnation="inc-1"))
    with pytest.raises(TableNotFound):
        await registry.drop_table(T, "inc-1", dropped_at_ms=6)
    dropped = await registry.dropped_tables()
    assert [(d.incarnation, d.dropped_version) for d in dropped] == [("inc-1", 0)]


@pytest.mark.asyncio
async def test_generation_moves_on_every_change(registry: RegistryStore) -> None:
    seen = [await registry.generation()]
    seen.append(await registry.create_table(record()))
    await registry.commit_append(commit(expected=0, engine_version=2))
    seen.append(await registry.generation())
    seen.append(await registry.drop_table(T, "inc-1", dropped_at_ms=3))
    assert len(set(seen)) == len(seen)
    counters = [int(g.rsplit(":", 1)[1]) for g in seen]
    assert counters == sorted(counters)
    generation, tables = await registry.snapshot()
    assert generation == seen[-1]
    assert tables == []


@pytest.mark.asyncio
async def test_generation_of_a_new_registry_never_matches(make_store: Factory) -> None:
    a, b = make_store("a"), make_store("b")
    await a.open()
    await b.open()
    assert await a.generation() != await b.generation()
    await a.close()
    await b.close()


@pytest.mark.asyncio
async def test_state_survives_reopen(make_store: Factory) -> None:
    store = make_store("r")
    await store.open()
    await store.create_table(record())
    await store.commit_append(commit(expected=0, engine_version=2))
    generation = await store.generation()
    await store.close()
    again = make_store("r")
    await again.open()
    assert await again.generation() == generation
    table = await again.get_table(T)
    assert table is not None
    assert table.version == 1
    await again.close()


@pytest.mark.asyncio
async def test_prune_forgets_only_old_operation_ids(registry: RegistryStore) -> None:
    await registry.create_table(record())
    old, new = new_operation_id(), new_operation_id()
    await registry.commit_append(commit(expected=0, engine_version=2, op=old))
    await registry.commit_append(commit(expected=1, engine_version=3, op=new))
    assert await registry.prune_operations(operation_time_ms(new)) in (0, 1)
    assert await registry.get_operation(new) is not None
    assert await registry.prune_operations(operation_time_ms(new) + 1) >= 1
    assert await registry.get_operation(old) is None
    assert await registry.get_operation(new) is None
    # Pruning ids never touches versions.
    assert len(await registry.versions("inc-1")) == 3


@pytest.mark.asyncio
async def test_snapshot_if_changed_skips_an_unchanged_catalog(registry: RegistryStore) -> None:
    await registry.create_table(record())
    generation, tables = await registry.snapshot_if_changed(None)
    assert tables is not None
    assert [t.table for t in tables] == [T]
    assert await registry.snapshot_if_changed(generation) == (generation, None)
    await registry.commit_append(commit(expected=0, engine_version=2))
    moved, tables = await registry.snapshot_if_changed(generation)
    assert moved != generation
    assert tables is not None
    assert tables[0].version == 1


@pytest.mark.asyncio
async def test_snapshot_lists_many_tables_in_order(registry: RegistryStore) -> None:
    # More than one 64-entry page, across every directory shard.
    names = [f"t{i:03d}" for i in range(150)]
    for i, name in enumerate(names):
        await registry.create_table(record(TableRef("fleet", name), incarnation=f"inc-{i}"))
    generation, tables = await registry.snapshot()
    assert [t.table.name for t in tables] == names
    assert generation == await registry.generation()


@pytest.mark.asyncio
async def test_a_version_is_found_by_number_and_by_time(registry: RegistryStore) -> None:
    """What a time-travel walk starts from: one record by number, or by time in log2(n) reads."""
    await registry.create_table(record())  # version 0, committed at 1 ms
    for version in range(1, 21):
        # Engine versions skip where Lance versions were not Lake ones (maintenance, orphans).
        grouped = commit(expected=version - 1, engine_version=version * 2)
        await registry.commit_append(dataclasses.replace(grouped, committed_at_ms=version * 1000))
    found = await registry.version_record("inc-1", 7)
    assert found is not None
    assert (found.version, found.engine_version, found.committed_at_ms) == (7, 14, 7000)
    assert found.operation_ids
    assert found.incarnation == "inc-1"
    assert await registry.version_record("inc-1", 21) is None
    assert await registry.version_record("inc-2", 7) is None
    history = await registry.versions("inc-1")
    for after_ms in [-1, *range(0, 21_001, 250)]:
        for newest in (0, 3, 20):
            # The bisection against reading every version, oldest first.
            later = [v for v in history if v.version <= newest and v.committed_at_ms > after_ms]
            want = later[0] if later else None
            assert await registry.first_version_after("inc-1", after_ms, newest) == want
    assert await registry.first_version_after("inc-2", 0, 20) is None  # no records: none
