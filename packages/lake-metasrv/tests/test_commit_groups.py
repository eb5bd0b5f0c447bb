"""Commit groups: concurrent appends to one table become one version, each with its own outcome.

A group is whatever queued while the table's previous commit ran. These
tests hold the table lock (as a create or maintenance would) while appends
queue, so the group they form is known exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import lance
import pytest

from lake_core.errors import StaleReadVersion
from lake_core.ids import new_operation_id
from lake_core.protocol import AppendCommand, AppendResult
from lake_metasrv.appends import Queued, check_rows
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.sidecars.local import LocalSidecarStore
from tools.lake_testing.waiting import until_async


def command(kit: Any, op: str | None = None, **fields: Any) -> AppendCommand:
    return AppendCommand(table=kit.episodes, operation_id=op or new_operation_id(), **fields)


@asynccontextmanager
async def lock_held(coord: CommitCoordinator, kit: Any) -> AsyncIterator[Callable[[int], Any]]:
    """Hold the table lock; yields ``queued(n)``, which waits until n appends are queued."""
    release = asyncio.Event()
    holder = asyncio.ensure_future(coord.run_exclusive(kit.episodes, release.wait()))

    async def queued(n: int) -> None:
        await until_async(lambda: len(coord._queues.get(kit.episodes, ())) >= n)

    try:
        yield queued
    finally:
        release.set()
        await holder


async def settle(tasks: list[Awaitable[AppendResult]]) -> list[AppendResult | BaseException]:
    return list(await asyncio.gather(*tasks, return_exceptions=True))


@pytest.mark.asyncio
async def test_queued_appends_commit_as_one_version_and_replay_it(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    commands = [command(kit) for _ in range(5)]
    async with lock_held(coordinator, kit) as queued:
        tasks = [
            asyncio.ensure_future(coordinator.append(c, kit.schema, [kit.make_batch(3, 10 * i)]))
            for i, c in enumerate(commands)
        ]
        await queued(5)
    results = await settle(tasks)
    assert all(isinstance(r, AppendResult) and r.version == 1 for r in results)
    record = await coordinator.describe_table(kit.episodes)
    assert (record.version, record.engine_version) == (1, 2)  # one Lance version for five
    dataset = lance.dataset(record.location, version=record.engine_version)
    assert len(dataset.get_fragments()) == 1  # their rows written together
    assert sorted(dataset.to_table().column("episode_id").to_pylist()) == sorted(
        f"ep-{10 * i + j}" for i in range(5) for j in range(3)
    )
    # Each retry gets the shared version back, exactly once, and adds nothing.
    for c in commands:
        again = await coordinator.append(c, kit.schema, [kit.make_batch(3)])
        assert (again.replayed, again.version) == (True, 1)
    assert (await coordinator.describe_table(kit.episodes)).version == 1
    history = await coordinator.registry.versions(record.incarnation)
    assert sorted(history[-1].operation_ids) == sorted(c.operation_id for c in commands)


@pytest.mark.asyncio
async def test_a_refused_append_leaves_its_group_committed(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    good = [command(kit) for _ in range(3)]
    # Its read version is ahead of the table: refused in the committer, alone.
    bad = command(kit, read_version=7)
    async with lock_held(coordinator, kit) as queued:
        tasks = [
            asyncio.ensure_future(coordinator.append(c, kit.schema, [kit.make_batch(1, i)]))
            for i, c in enumerate([good[0], bad, *good[1:]])
        ]
        await queued(4)
    results = await settle(tasks)
    assert isinstance(results[1], StaleReadVersion)
    ok = [r for r in results if isinstance(r, AppendResult)]
    assert [r.version for r in ok] == [1, 1, 1]
    record = await coordinator.describe_table(kit.episodes)
    table = await coordinator.engine.read(record.location, record.engine_version)
    assert sorted(table.column("episode_id").to_pylist()) == ["ep-0", "ep-2", "ep-3"]
    assert await coordinator.registry.get_operation(bad.operation_id) is None


@pytest.mark.asyncio
async def test_rows_lance_refuses_fail_only_their_own_append(
    coordinator: CommitCoordinator, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose rows pass the checks but which Lance refuses in the group's
    write does not take the group down: its appends go again, each alone."""
    await coordinator.create_table(kit.episodes, kit.schema)
    real = coordinator.engine.prepare

    async def prepare(location: str, incarnation: str, version: int, data: Any, **kw: Any) -> Any:
        if "ep-100" in data.column("episode_id").to_pylist():
            raise OSError("LanceError(Arrow): Invalid argument error: refused")
        return await real(location, incarnation, version, data, **kw)

    monkeypatch.setattr(coordinator.engine, "prepare", prepare)
    good = [command(kit) for _ in range(3)]
    bad = command(kit)
    async with lock_held(coordinator, kit) as queued:
        tasks = [
            asyncio.ensure_future(coordinator.append(c, kit.schema, [kit.make_batch(1, start)]))
            for c, start in [(good[0], 0), (bad, 100), (good[1], 1), (good[2], 2)]
        ]
        await queued(4)
    results = await settle(tasks)
    assert isinstance(results[1], OSError)
    assert sorted(r.version for r in results if isinstance(r, AppendResult)) == [1, 2, 3]
    record = await coordinator.describe_table(kit.episodes)
    table = await coordinator.engine.read(record.location, record.engine_version)
    assert sorted(table.column("episode_id").to_pylist()) == ["ep-0", "ep-1", "ep-2"]
    assert await coordinator.registry.get_operation(bad.operation_id) is None
    # The next group forms as before.
    async with lock_held(coordinator, kit) as queued:
        tasks = [
            asyncio.ensure_future(
                coordinator.append(command(kit), kit.schema, [kit.make_batch(1, i)])
            )
            for i in (3, 4)
        ]
        await queued(2)
    assert [r.version for r in await settle(tasks)] == [4, 4]  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_only_one_conditional_append_holds_a_version(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    first, second = command(kit, read_version=0), command(kit, read_version=0)
    plain = command(kit)
    async with lock_held(coordinator, kit) as queued:
        tasks = [
            asyncio.ensure_future(coordinator.append(c, kit.schema, [kit.make_batch(1, i)]))
            for i, c in enumerate([plain, first, second])
        ]
        await queued(3)
    results = await settle(tasks)
    # Both read version 0: one commits at 1 (with the unconditional one), the other is stale.
    assert isinstance(results[0], AppendResult)
    assert results[0].version == 1
    won = [r.version for r in results[1:] if isinstance(r, AppendResult)]
    stale = [r for r in results[1:] if isinstance(r, StaleReadVersion)]
    assert (won, len(stale)) == ([1], 1)


@pytest.mark.asyncio
async def test_group_bounds_split_the_queue(make_coordinator: Any, kit: Any) -> None:
    coord = make_coordinator(group_max_appends=3, group_max_rows=5)
    await coord.open()
    try:
        await coord.create_table(kit.episodes, kit.schema)
        sizes = [1, 1, 1, 1, 2, 2, 4]
        async with lock_held(coord, kit) as queued:
            tasks = []
            for n in sizes:  # one at a time: the queue keeps this order
                batch = kit.make_batch(n)
                tasks.append(asyncio.ensure_future(coord.append(command(kit), kit.schema, [batch])))
                await queued(len(tasks))
        results = await settle(tasks)
        # At most 3 appends and 5 rows a group: [1,1,1] [1,2,2] [4].
        assert [r.version for r in results if isinstance(r, AppendResult)] == [1, 1, 1, 2, 2, 2, 3]
    finally:
        await coord.close()


@pytest.mark.asyncio
async def test_prewritten_fragments_commit_in_the_group_s_version(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    # The bulk-ingest hook: an append whose fragments were written before it queued.
    record = await coordinator.create_table(kit.episodes, kit.schema)
    ingest = command(kit)
    checked = check_rows(
        record, kit.schema, [kit.make_batch(50, 1000)], coordinator.stage.scope("local")
    )
    prepared = await coordinator.engine.prepare(
        record.location, record.incarnation, record.engine_version, checked.data
    )
    future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
    small = command(kit)
    async with lock_held(coordinator, kit) as queued:
        task = asyncio.ensure_future(coordinator.append(small, kit.schema, [kit.make_batch(2)]))
        await queued(1)
        coordinator.enqueue(
            Queued(
                ingest,
                kit.schema,
                [],
                50,
                0,
                coordinator.stage.scope("local"),
                checked,
                prepared,
                future,
            )
        )
    results = await settle([task, future])
    assert [r.version for r in results if isinstance(r, AppendResult)] == [1, 1]
    current = await coordinator.describe_table(kit.episodes)
    table = await coordinator.engine.read(current.location, current.engine_version)
    assert table.num_rows == 52
    assert current.engine_version == 2


@pytest.mark.asyncio
async def test_one_merged_sidecar_per_group(coordinator: CommitCoordinator, kit: Any) -> None:
    await coordinator.create_table(kit.episodes, kit.file_schema)
    commands = [command(kit) for _ in range(3)]
    async with lock_held(coordinator, kit) as queued:
        tasks = [
            asyncio.ensure_future(
                coordinator.append(c, kit.file_schema, [kit.make_batch(2, 2 * i, kit.file_schema)])
            )
            for i, c in enumerate(commands)
        ]
        await queued(3)
    await settle(tasks)
    record = await coordinator.describe_table(kit.episodes)
    assert isinstance(coordinator.sidecars, LocalSidecarStore)
    delta = coordinator.sidecars.read_delta(record.incarnation, 1)
    assert sorted(delta.operation_ids) == sorted(c.operation_id for c in commands)
    assert delta.adds == sorted(f"file:///stage/tenants/local/v{i}.mp4" for i in range(6))
    assert not (coordinator.sidecars.path(record.incarnation, 2)).exists()
