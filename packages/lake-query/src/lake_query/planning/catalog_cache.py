"""The Query replica's view of the native catalog, fed by Metasrv snapshots.

The source is Metasrv's conditional ``catalog_snapshot`` action: the
cache sends the generation it holds and gets ``not_modified`` or the whole
directory. It refreshes in the background at a fixed interval and
(coalesced) when planning needs it: a table missing, a view older than the
freshness bound, a client's committed version it has not seen
(:mod:`lake_query.planning.freshness`), a head version retention reclaimed. Until
the first snapshot arrives (Metasrv not up yet) it retries quickly.
Lookups and listings read an immutable in-memory snapshot and make no RPCs;
a failed refresh keeps the last good snapshot.

An append this replica forwarded patches its table from the commit result
(:meth:`CatalogCache.apply_commit`), before the client is answered. Views
only move forward: within one incarnation a table's descriptor never goes
back to an older (version, engine version), so a snapshot fetched before a
patch cannot undo it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import structlog

from lake_core import protocol
from lake_core.errors import FailedPrecondition, LakeError
from lake_core.models import CatalogEntry, TableDescriptor
from lake_core.names import TableRef
from lake_core.schemas import schema_from_base64, schema_to_ipc
from lake_core.telemetry import series

__all__ = ["FIRST_LOAD_BACKOFF_S", "CachedTable", "CatalogCache", "CatalogSource"]

log = structlog.get_logger("lake_query.catalog_cache")


class CatalogSource(Protocol):
    """Where snapshots come from (``lake_core.metaclient.MetaClient`` in production)."""

    async def catalog_snapshot(self, generation: str | None) -> protocol.CatalogSnapshotResult: ...


@dataclass(frozen=True)
class CachedTable:
    """One catalog entry with its Arrow schema decoded once, at refresh time."""

    entry: CatalogEntry
    schema: pa.Schema | None
    schema_error: str | None = None

    @property
    def table(self) -> TableRef:
        return self.entry.table

    def schema_ipc(self) -> bytes:
        """The table's IPC schema, or FailedPrecondition if its registration has none."""
        if self.schema is None:
            raise FailedPrecondition(
                f"{self.table.qualified} has no readable schema in the catalog "
                f"({self.schema_error}); recreate or migrate the table"
            )
        return schema_to_ipc(self.schema)


def _decode(entry: CatalogEntry) -> CachedTable:
    try:
        return CachedTable(entry, schema_from_base64(entry.schema_ipc))
    except LakeError as exc:
        return CachedTable(entry, None, str(exc))


@dataclass(frozen=True)
class _Snapshot:
    generation: str | None
    tables: Mapping[TableRef, CachedTable]
    ordered: tuple[CachedTable, ...]


_EMPTY = _Snapshot(None, {}, ())

#: First and longest wait between attempts at the first snapshot, in seconds: a replica
#: started before Metasrv serves within a fraction of a second of Metasrv answering.
FIRST_LOAD_BACKOFF_S = (0.05, 0.25)


def _newer(mine: TableDescriptor, theirs: TableDescriptor) -> bool:
    """Whether ``mine`` is a later state of the same table incarnation than ``theirs``."""
    return mine.incarnation == theirs.incarnation and (mine.version, mine.engine_version) > (
        theirs.version,
        theirs.engine_version,
    )


def _ordered(tables: Mapping[TableRef, CachedTable]) -> tuple[CachedTable, ...]:
    return tuple(sorted(tables.values(), key=lambda t: (t.table.namespace, t.table.name)))


class CatalogCache:
    """TableRef -> CatalogEntry (with decoded schema), refreshed from a CatalogSource."""

    def __init__(self, source: CatalogSource, refresh_interval_s: float = 1.0) -> None:
        self._source = source
        self._interval = refresh_interval_s
        self._snapshot = _EMPTY
        self._lock = asyncio.Lock()
        self._requested = 0
        self._completed = 0
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        #: Bumped whenever the view changes (a changed snapshot or a commit applied).
        self.revision = 0
        #: When the fetch behind the current view was sent (monotonic; None: never).
        self._fresh_at: float | None = None
        #: When a fetch last failed (monotonic), so a failing Metasrv is not asked per request.
        self._failed_at: float | None = None
        self._on_loaded: list[Callable[[], None]] = []
        self._on_version: list[Callable[[TableRef, TableDescriptor], None]] = []

    def __repr__(self) -> str:
        return f"CatalogCache(generation={self.generation!r}, tables={len(self._snapshot.tables)})"

    # Reads: in memory only, safe from any thread (the snapshot is swapped whole).

    @property
    def generation(self) -> str | None:
        return self._snapshot.generation

    @property
    def loaded(self) -> bool:
        return self._snapshot.generation is not None

    def lookup(self, table: TableRef) -> CachedTable | None:
        found = self._snapshot.tables.get(table)
        series.CATALOG_LOOKUPS.inc(result="miss" if found is None else "hit")
        return found

    def entry(self, table: TableRef) -> CatalogEntry | None:
        found = self._snapshot.tables.get(table)
        return None if found is None else found.entry

    @property
    def interval_s(self) -> float:
        """The background refresh interval (``LAKE_QUERY_CATALOG_REFRESH_MS``): the freshness bound."""
        return self._interval

    def age_s(self) -> float | None:
        """Seconds since the request behind this view was sent (None: never loaded)."""
        return None if self._fresh_at is None else time.monotonic() - self._fresh_at

    def stale(self, max_age_s: float) -> bool:
        """Whether this view is older than ``max_age_s`` and Metasrv did not just fail.

        After a failed fetch the view stays "fresh enough" for one more
        interval: a failing Metasrv is asked by the background task, not by
        every request.
        """
        age = self.age_s()
        if age is not None and age <= max_age_s:
            return False
        failed = self._failed_at
        return failed is None or time.monotonic() - failed > max_age_s

    def apply_commit(self, table: TableRef, descriptor: TableDescriptor) -> bool:
        """Move ``table`` to ``descriptor`` (a commit result) if that is newer than this view.

        Only a known table of the same incarnation moves (its schema is
        unchanged by an append); anything else waits for the next refresh.
        Returns True if the view changed.
        """
        current = self._snapshot
        cached = current.tables.get(table)
        if cached is None or not _newer(descriptor, cached.entry.descriptor):
            return False
        moved = CachedTable(
            cached.entry.model_copy(update={"descriptor": descriptor}),
            cached.schema,
            cached.schema_error,
        )
        tables = {**current.tables, table: moved}
        # The generation stays: the next conditional refresh still fetches what changed.
        self._snapshot = _Snapshot(current.generation, tables, _ordered(tables))
        self.revision += 1
        log.debug("catalog entry moved by a commit", table=str(table), version=descriptor.version)
        self._moved([(table, descriptor)])
        return True

    def tables(self) -> tuple[CachedTable, ...]:
        """Every table, ordered by namespace then name."""
        return self._snapshot.ordered

    def table_refs(self) -> list[TableRef]:
        return [t.table for t in self._snapshot.ordered]

    def namespaces(self) -> list[str]:
        return sorted({t.table.namespace for t in self._snapshot.ordered})

    # Refreshes.

    async def refresh(self) -> bool:
        """Bring the cache up to date with a snapshot requested after this call.

        Concurrent callers share one RPC: a refresh that starts after a call
        was made satisfies it. Returns True if the catalog changed.
        """
        self._requested += 1
        ticket = self._requested
        async with self._lock:
            if self._completed >= ticket:
                return False
            covers = self._requested
            changed = await self._fetch()
            self._completed = covers
            return changed

    async def _fetch(self) -> bool:
        current = self._snapshot
        sent = time.monotonic()
        try:
            result = await self._source.catalog_snapshot(current.generation)
        except BaseException:
            self._failed_at = time.monotonic()
            series.CATALOG_REFRESHES.inc(outcome="failed")
            raise
        self._fresh_at, self._failed_at = sent, None
        if result.not_modified:
            series.CATALOG_REFRESHES.inc(outcome="not_modified")
            return False
        series.CATALOG_REFRESHES.inc(outcome="changed")
        decoded = [_decode(e) for e in result.tables]
        # A commit applied since this fetch was sent (apply_commit) is kept.
        latest = self._snapshot.tables
        tables = {
            t.table: (
                latest[t.table]
                if t.table in latest
                and _newer(latest[t.table].entry.descriptor, t.entry.descriptor)
                else t
            )
            for t in decoded
        }
        self._snapshot = _Snapshot(result.generation, tables, _ordered(tables))
        self.revision += 1
        before = current.tables
        self._moved(
            [
                (ref, cached.entry.descriptor)
                for ref, cached in tables.items()
                if ref in before and before[ref].entry.descriptor != cached.entry.descriptor
            ]
        )
        if current.generation is None:
            log.info("catalog loaded", generation=result.generation, tables=len(decoded))
            self._loaded()
        for broken in (t for t in decoded if t.schema is None):
            log.warning("catalog entry without a readable schema", table=str(broken.table))
        log.debug("catalog refreshed", generation=result.generation, tables=len(decoded))
        return True

    async def start(self) -> None:
        """Load the first snapshot if Metasrv answers, then refresh in the background.

        Metasrv not reachable yet (not started, restarting, failing over: a
        retryable error) does not fail the start: the first load is retried in
        the background with short capped backoff (:data:`FIRST_LOAD_BACKOFF_S`)
        until it succeeds, and :meth:`on_loaded` callbacks run then. Other
        errors (a refused credential) propagate.
        """
        try:
            await self.refresh()
        except LakeError as exc:
            if not exc.retryable:
                raise
            log.warning("catalog not loaded yet; retrying", error=str(exc))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lake-query-catalog-refresh")

    def on_loaded(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the first snapshot is held (now, if it is already)."""
        if self.loaded:
            callback()
        else:
            self._on_loaded.append(callback)

    def on_version(self, callback: Callable[[TableRef, TableDescriptor], None]) -> None:
        """Call ``callback(table, descriptor)`` whenever a known table moves to a new version.

        Called on the event loop, from refreshes and applied commits; it must
        be quick and not raise (an exception is logged and dropped).
        """
        self._on_version.append(callback)

    def _moved(self, moved: list[tuple[TableRef, TableDescriptor]]) -> None:
        for table, descriptor in moved:
            for callback in self._on_version:
                try:
                    callback(table, descriptor)
                except Exception:
                    log.exception("catalog version listener failed", table=str(table))

    def _loaded(self) -> None:
        callbacks, self._on_loaded = self._on_loaded, []
        for callback in callbacks:
            callback()

    async def _first_load(self) -> None:
        """Retry the first snapshot until Metasrv answers (any error: it may be starting)."""
        delay = FIRST_LOAD_BACKOFF_S[0]
        while not self.loaded:
            await asyncio.sleep(delay)
            delay = min(delay * 2, FIRST_LOAD_BACKOFF_S[1])
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("catalog still not loaded", error=str(exc))

    async def _run(self) -> None:
        await self._first_load()
        failing = False
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.refresh()
                if failing:
                    log.info("catalog refresh recovered", generation=self.generation)
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failing:
                    log.warning("catalog refresh failed; serving the last snapshot", error=str(exc))
                failing = True

    def refresh_soon(self) -> None:
        """Schedule a refresh without waiting for it (errors are logged)."""

        async def run() -> None:
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("catalog refresh failed", error=str(exc))

        task = asyncio.get_running_loop().create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._pending) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._task = None
