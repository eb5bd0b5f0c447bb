"""The catalog cache: conditional snapshots, zero RPCs when warm."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.errors import FailedPrecondition, Unavailable
from lake_core.names import TableRef
from lake_core.schemas import schema_from_ipc
from lake_query.planning.catalog_cache import FIRST_LOAD_BACKOFF_S, CatalogCache

from .conftest import LocalCatalog, rewards


@pytest.mark.asyncio
async def test_warm_lookups_and_listings_make_no_rpcs(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=3600)
    await cache.start()
    try:
        assert catalog.calls == 1
        for _ in range(100):
            found = cache.lookup(TableRef("robots", "episodes"))
            assert found is not None
            assert found.schema is not None
            assert cache.lookup(TableRef("robots", "nope")) is None
            assert cache.namespaces() == ["robots", "secret"]
            assert [str(t.table) for t in cache.tables()] == [
                "robots.episodes",
                "robots.rewards",
                "secret.plans",
            ]
        assert catalog.calls == 1
    finally:
        await cache.close()


@pytest.mark.asyncio
async def test_schemas_are_decoded_once_and_exact(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog)
    await cache.refresh()
    cached = cache.lookup(TableRef("robots", "rewards"))
    assert cached is not None
    assert cached.schema == pa.schema([("episode_id", pa.int64()), ("reward", pa.float32())])
    assert schema_from_ipc(cached.schema_ipc()) == cached.schema


@pytest.mark.asyncio
async def test_unchanged_generation_is_not_modified(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog)
    assert await cache.refresh() is True
    assert await cache.refresh() is False
    catalog.append("robots.rewards", rewards(10**6, 1))
    assert await cache.refresh() is True
    entry = cache.entry(TableRef("robots", "rewards"))
    assert entry is not None
    assert entry.descriptor.version == 2


@pytest.mark.asyncio
async def test_concurrent_refreshes_share_one_rpc(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog)
    await cache.refresh()
    before = catalog.calls
    await asyncio.gather(*(cache.refresh() for _ in range(20)))
    # The first waits for nothing; the rest share at most one more snapshot.
    assert catalog.calls - before <= 2


@pytest.mark.asyncio
async def test_background_refresh_sees_new_tables(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=0.02)
    await cache.start()
    try:
        catalog.create("robots.new_one", rewards(0, 1))
        for _ in range(200):
            if cache.lookup(TableRef("robots", "new_one")) is not None:
                break
            await asyncio.sleep(0.01)
        assert cache.lookup(TableRef("robots", "new_one")) is not None
    finally:
        await cache.close()


@pytest.mark.asyncio
async def test_failed_refresh_keeps_the_last_snapshot(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=0.01)
    await cache.start()
    try:
        catalog.fail = True
        await asyncio.sleep(0.1)
        assert cache.lookup(TableRef("robots", "episodes")) is not None
        with pytest.raises(ConnectionError):
            await cache.refresh()
    finally:
        await cache.close()


@pytest.mark.asyncio
async def test_first_snapshot_failure_propagates(catalog: LocalCatalog) -> None:
    catalog.fail = True
    cache = CatalogCache(catalog)
    with pytest.raises(ConnectionError):
        await cache.start()
    assert not cache.loaded


class Unreachable:
    """A catalog source that is unavailable (Metasrv not up) until ``up`` is set."""

    def __init__(self, catalog: LocalCatalog) -> None:
        self.catalog = catalog
        self.up = False
        self.calls = 0

    async def catalog_snapshot(self, generation: str | None) -> protocol.CatalogSnapshotResult:
        self.calls += 1
        if not self.up:
            raise Unavailable("metadata service unavailable: connection refused")
        return await self.catalog.catalog_snapshot(generation)


@pytest.mark.asyncio
async def test_first_snapshot_unavailable_is_retried_quickly(catalog: LocalCatalog) -> None:
    source = Unreachable(catalog)
    cache = CatalogCache(source, refresh_interval_s=3600)
    loaded = asyncio.Event()
    cache.on_loaded(loaded.set)
    await cache.start()  # Metasrv not up: no error, the replica binds anyway
    try:
        assert not cache.loaded
        await asyncio.sleep(0.5)
        assert source.calls >= 3  # retried, far more often than the refresh interval
        assert not loaded.is_set()
        source.up = True
        up = asyncio.get_running_loop().time()
        await asyncio.wait_for(loaded.wait(), 5)
        assert asyncio.get_running_loop().time() - up <= FIRST_LOAD_BACKOFF_S[1] + 0.2
        assert cache.lookup(TableRef("robots", "episodes")) is not None
        fired: list[bool] = []
        cache.on_loaded(lambda: fired.append(True))  # already loaded: at once
        assert fired == [True]
    finally:
        await cache.close()


@pytest.mark.asyncio
async def test_entry_without_schema_fails_explicitly(catalog: LocalCatalog) -> None:
    ref = TableRef("robots", "rewards")
    catalog.entries[ref] = catalog.entries[ref].model_copy(update={"schema_ipc": ""})
    catalog.generation += 1
    cache = CatalogCache(catalog)
    await cache.refresh()
    cached = cache.lookup(ref)
    assert cached is not None
    assert cached.schema is None
    with pytest.raises(FailedPrecondition, match=r"lake\.robots\.rewards"):
        cached.schema_ipc()


@pytest.mark.asyncio
async def test_a_commit_result_moves_the_view_forward_only(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=3600)
    await cache.refresh()
    table = TableRef("robots", "rewards")
    held = cache.entry(table)
    assert held is not None
    stale = catalog.calls, cache.generation, held.descriptor
    schema = cache.lookup(table).schema  # type: ignore[union-attr]
    committed = catalog.append("robots.rewards", rewards(10**6, 1)).descriptor
    revision = cache.revision
    assert cache.apply_commit(table, committed) is True
    assert cache.revision == revision + 1
    moved = cache.entry(table)
    assert moved is not None
    assert moved.descriptor == committed
    assert cache.lookup(table).schema == schema  # type: ignore[union-attr]
    # No RPC, and the generation stays so the next refresh still fetches what changed.
    assert (catalog.calls, cache.generation) == stale[:2]
    # An older result (a replay, a slower writer) never moves it back.
    assert cache.apply_commit(table, stale[2]) is False
    assert cache.entry(table).descriptor == committed  # type: ignore[union-attr]
    # A table the view does not hold waits for a refresh.
    assert cache.apply_commit(TableRef("robots", "unknown"), committed) is False


@pytest.mark.asyncio
async def test_a_snapshot_sent_before_a_commit_does_not_undo_it(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=3600)
    await cache.refresh()
    table = TableRef("robots", "rewards")
    before = catalog.entries[table]
    catalog.generation += 1  # some other table changed: the next snapshot is "changed"
    newer = catalog.append("robots.rewards", rewards(10**6, 1)).descriptor
    catalog.entries[table] = before  # the snapshot in flight still holds the older version
    assert cache.apply_commit(table, newer)
    assert await cache.refresh() is True
    assert cache.entry(table).descriptor == newer  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_staleness_follows_the_refresh_interval(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=0.05)
    assert cache.stale(0.05)
    assert cache.age_s() is None
    await cache.refresh()
    assert not cache.stale(0.05)
    await asyncio.sleep(0.1)
    assert cache.stale(0.05)
    catalog.fail = True
    with pytest.raises(ConnectionError):
        await cache.refresh()
    # A failing source is not asked again by every request within the interval.
    assert not cache.stale(0.05)


@pytest.mark.asyncio
async def test_listeners_hear_of_each_known_table_that_moves(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=3600)
    heard: list[tuple[str, int]] = []
    cache.on_version(lambda table, d: heard.append((str(table), d.version)))
    cache.on_version(lambda table, d: 1 / 0)  # a failing listener is logged, not fatal
    await cache.refresh()
    assert heard == []  # the first load moves nothing
    table = TableRef("robots", "rewards")
    committed = catalog.append("robots.rewards", rewards(10**6, 1)).descriptor
    assert cache.apply_commit(table, committed)
    assert heard == [("robots.rewards", committed.version)]
    assert not cache.apply_commit(table, committed)  # not a move: not heard again
    catalog.create("robots.new_one", rewards(0, 1))
    again = catalog.append("robots.rewards", rewards(2 * 10**6, 1)).descriptor
    assert await cache.refresh()
    # A new table is no move, and the unchanged tables are not heard of again.
    assert heard == [
        ("robots.rewards", committed.version),
        ("robots.rewards", again.version),
    ]
