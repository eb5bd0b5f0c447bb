"""Table maintenance: compaction and scalar indexes, committed without a new Lake version.

Every append becomes its own small Lance fragment, and a filter on a column
without an index reads the whole column. Maintenance changes a table's
physical layout, never its rows: the table keeps its Lake version, and the
registry's compare-and-swap (:meth:`RegistryStore.commit_maintenance`) moves
only the Lance ``engine_version`` readers are pointed at, bumping the
generation so Query's catalog caches refresh. In order, under the table lock
(:meth:`CommitCoordinator.run_exclusive`, the same lock appends take)::

    read the registered record                   (column checks: before any write)
    open the registered Lance version; decide whether there is work  [no write]
    restore the registered version over unregistered orphans         [as appends do]
    Lance: optimize_indices / compact_files / create_scalar_index    [off the loop]
    check the row count is unchanged; fsync what Lance wrote (local)
    write the empty reference-delta sidecar for (version, e')  [durable]
    registry: engine_version e -> e'  (same Lake version)   <- visibility point
    retention (failure logged, never fails the maintenance)

A crash before the registry step leaves an invisible orphan that the next
append or maintenance restores over. Tickets issued before keep the old
Lance version, readable until retention reclaims it, exactly as after an
append: only once it is outside both the count window
(``LAKE_LANCE_RETAIN_VERSIONS``) and the age floor
(``LAKE_LANCE_RETAIN_MIN_AGE_SECS``), through the same engine cleanup. The sidecar is empty (no FILE
reference changes) but present, so every version the registry can point at
has one and ``lake gc`` needs no exception for maintenance.

:class:`AutoCompactor` runs :meth:`Maintenance.compact` in the background
(``LAKE_COMPACTION``) once a table has many small fragments, at most once a
minute per table and over a bounded number of source rows per run, so an
append never waits long behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import lance
import pyarrow as pa
import structlog
from lance.optimize import Compaction, CompactionOptions

from lake_core import faults
from lake_core.config import COMPACTION
from lake_core.durable import fsync_written_since
from lake_core.errors import (
    ConfigError,
    Internal,
    InvalidArgument,
    LakeError,
    StaleReadVersion,
    TableNotFound,
    Unavailable,
)
from lake_core.filetype import is_file_field
from lake_core.models import incarnation_of
from lake_core.names import TableRef
from lake_core.protocol import IndexKind, MaintenanceResult
from lake_core.telemetry import series
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.registry.base import MaintenanceCommit, TableRecord
from lake_metasrv.sidecars.base import ReferenceDelta

__all__ = [
    "COMPACTION",
    "AutoCompactor",
    "CompactionSettings",
    "Maintenance",
    "index_column_error",
]

log = structlog.get_logger("lake_metasrv.maintenance")
T = TypeVar("T")


#: Fragments are merged up to this many rows.
TARGET_ROWS_PER_FRAGMENT = 1 << 20
_BTREE_TYPES = "integer, floating point, boolean, string, binary, decimal, date or timestamp"


@dataclass(frozen=True)
class CompactionSettings:
    """When the background compactor runs, and how much one run may rewrite."""

    enabled: bool = True
    #: A table is compacted once it holds this many fragments of fewer than
    #: ``small_fragment_rows`` rows.
    min_small_fragments: int = 64
    small_fragment_rows: int = 100_000
    #: How often the compactor looks for work, and the least time between two
    #: automatic compactions of one table found by looking.
    interval_s: float = 10.0
    min_gap_s: float = 60.0
    #: A table that took this many appends since it was last looked at is
    #: looked at right away (every append is a fragment, and each Lance commit,
    #: fragment write and retention pass costs time in proportion to them).
    appends_per_look: int = 256
    #: Source rows one automatic run rewrites at most (the table lock is held
    #: meanwhile, so this bounds how long an append can wait).
    max_source_rows: int = 4 * TARGET_ROWS_PER_FRAGMENT

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CompactionSettings:
        raw = (env.get(COMPACTION) or "on").strip().lower()
        if raw in ("on", "true", "1"):
            return cls(enabled=True)
        if raw in ("off", "false", "0"):
            return cls(enabled=False)
        raise ConfigError(f"{COMPACTION} must be 'on' or 'off', got {raw[:40]!r}")


def index_column_error(schema: pa.Schema, column: str, kind: str) -> str | None:
    """Why ``column`` cannot carry a ``kind`` scalar index, or None if it can."""
    if kind not in ("BTREE", "BITMAP"):
        return f"index kind {kind[:40]!r} is not supported (BTREE or BITMAP)"
    if column not in schema.names:
        return f"no column {column[:100]!r}"
    field = schema.field(column)
    if is_file_field(field):
        return f"column {column!r} is a FILE value; index a scalar column instead"
    t = field.type
    scalar = (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )
    if not scalar:
        return f"column {column!r} has type {t}; a {kind} index needs {_BTREE_TYPES}"
    if kind == "BITMAP" and pa.types.is_floating(t):
        return f"column {column!r} has type {t}; a BITMAP index needs a discrete type"
    return None


# -- Lance work (blocking; runs in a worker thread) ------------------------------------


@dataclass(frozen=True)
class _Dataset:
    """How to open one table's dataset with this Metasrv's engine."""

    uri: str
    options: dict[str, str] | None
    local: Path | None  # fsync what Lance wrote here; None on S3 (puts are durable)
    fence: Callable[[], object]

    def open(self, version: int | None = None) -> Any:
        return lance.dataset(self.uri, version=version, storage_options=self.options)


@dataclass(frozen=True)
class _Outcome:
    engine_version: int  # the registered one when nothing was written
    fragments_before: int
    fragments_after: int
    indexes: list[str]


def _registered(target: _Dataset, record: TableRecord) -> Any:
    try:
        dataset = target.open(record.engine_version)
    except (ValueError, OSError) as exc:
        raise Internal(
            f"cannot open {record.table} at its registered Lance version "
            f"{record.engine_version}: {exc}"
        ) from None
    owner = incarnation_of(dataset.schema.metadata)
    if owner != record.incarnation:
        raise Internal(
            f"dataset {record.location} belongs to incarnation {owner or '?'}, "
            f"the registry says {record.incarnation}"
        )
    return dataset


def _writable_head(target: _Dataset, record: TableRecord) -> Any:
    """The latest dataset, the registered version restored first over any orphan.

    An orphan (a Lance version never registered: a crash after Lance wrote)
    must not leak its rows into a compacted version.
    """
    latest = target.open()
    if latest.version == record.engine_version:
        return latest
    if latest.version < record.engine_version:
        raise Internal(
            f"dataset {record.location} is at Lance version {latest.version}, "
            f"behind the registered {record.engine_version}: versions were lost"
        )
    log.warning(
        "restoring registered version over unregistered Lance versions",
        location=record.location,
        registered=record.engine_version,
        latest=latest.version,
    )
    target.fence()
    target.open(record.engine_version).restore()
    return target.open()


def _unindexed(dataset: Any) -> list[str]:
    """Indexes that do not cover every fragment (appends since they were built)."""
    names = [d.name for d in dataset.describe_indices()]
    return [n for n in names if dataset.stats.index_stats(n).get("num_unindexed_fragments", 0)]


def _finish(
    target: _Dataset, record: TableRecord, before: Any, head: Any, started_ns: int
) -> _Outcome:
    if head.version == record.engine_version:
        after = before
    else:
        after = head
        if head.count_rows() != before.count_rows():
            raise Internal(
                f"maintenance of {record.table} changed its row count "
                f"({before.count_rows()} -> {head.count_rows()}); not registered"
            )
        if target.local is not None:
            # Index directories included; concurrent appends' temp files skipped.
            fsync_written_since(target.local, started_ns, parent=True)
    return _Outcome(
        engine_version=int(after.version),
        fragments_before=len(before.get_fragments()),
        fragments_after=len(after.get_fragments()),
        indexes=sorted(d.name for d in after.describe_indices()),
    )


def _small_fragments(target: _Dataset, record: TableRecord, small_rows: int) -> int:
    dataset = target.open(record.engine_version)
    return sum(1 for f in dataset.get_fragments() if f.metadata.physical_rows < small_rows)


def _compact(
    target: _Dataset,
    record: TableRecord,
    *,
    min_small: int,
    small_rows: int,
    max_source_rows: int | None,
    threads: int | None,
) -> _Outcome:
    started = time.time_ns()
    before = _registered(target, record)
    options = CompactionOptions(target_rows_per_fragment=TARGET_ROWS_PER_FRAGMENT)
    if max_source_rows is not None:
        options["max_source_rows"] = max_source_rows
    if threads is not None:
        options["num_threads"] = threads
    small = sum(1 for f in before.get_fragments() if f.metadata.physical_rows < small_rows)
    stale_indexes = _unindexed(before)
    # Lance merges only fragments covered by the same indexes: refresh them first.
    wanted = small >= min_small and (
        bool(stale_indexes) or Compaction.plan(before, options).num_tasks() > 0
    )
    if not wanted and not stale_indexes:
        return _finish(target, record, before, before, started)
    head = _writable_head(target, record)
    if stale_indexes:
        target.fence()
        head.optimize.optimize_indices(index_names=stale_indexes)
        head = target.open()
    if wanted:
        target.fence()
        head.optimize.compact_files(**options)
        head = target.open()
    return _finish(target, record, before, head, started)


def _create_index(target: _Dataset, record: TableRecord, column: str, kind: str) -> _Outcome:
    started = time.time_ns()
    before = _registered(target, record)
    head = _writable_head(target, record)
    target.fence()
    try:
        head.create_scalar_index(column, kind, name=f"{column}_idx", replace=True)
    except (TypeError, ValueError) as exc:
        # Only orphans can exist now (not registered); the next change restores over them.
        raise InvalidArgument(f"cannot index {record.table}.{column}: {exc}") from None
    return _finish(target, record, before, target.open(), started)


# -- the maintenance commit --------------------------------------------------------------


class Maintenance:
    """Compaction and index creation for one Metasrv's tables (see the module docstring)."""

    def __init__(
        self,
        coordinator: CommitCoordinator,
        settings: CompactionSettings | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.settings = settings or CompactionSettings()
        self._faults = coordinator.config.faults

    def _dataset(self, record: TableRecord) -> _Dataset:
        engine = self.coordinator.engine
        location = record.location
        return _Dataset(
            engine.uri(location),
            engine.storage_options(location),
            engine.local_path(location),
            engine.fence,
        )

    async def compact(self, table: TableRef, *, automatic: bool = False) -> MaintenanceResult:
        """Merge small fragments into ~1M-row ones and bring indexes up to date.

        An explicit call compacts whenever Lance finds adjacent small
        fragments to merge; ``automatic`` (the background compactor) only at
        ``min_small_fragments`` small fragments, and over at most
        ``max_source_rows`` rows per run.
        """
        settings = self.settings

        async def work() -> MaintenanceResult:
            record = await self.coordinator.describe_table(table)
            target = self._dataset(record)
            outcome = await asyncio.to_thread(
                _compact,
                target,
                record,
                min_small=settings.min_small_fragments if automatic else 2,
                small_rows=settings.small_fragment_rows if automatic else TARGET_ROWS_PER_FRAGMENT,
                max_source_rows=settings.max_source_rows if automatic else None,
                threads=1 if automatic else None,
            )
            return await self._commit(record, outcome, "compaction")

        return await counted_run("compact", self.coordinator.run_exclusive(table, work()))

    async def create_index(
        self, table: TableRef, column: str, kind: IndexKind | str = "BTREE"
    ) -> MaintenanceResult:
        """Build (or rebuild) a scalar index ``<column>_idx``; filters on it then use it."""
        kind = kind.upper()

        async def work() -> MaintenanceResult:
            record = await self.coordinator.describe_table(table)
            problem = index_column_error(record.schema, column, kind)
            if problem is not None:
                raise InvalidArgument(f"cannot index {table}: {problem}")
            target = self._dataset(record)
            outcome = await asyncio.to_thread(_create_index, target, record, column, kind)
            return await self._commit(record, outcome, f"{kind} index on {column}")

        return await counted_run("index", self.coordinator.run_exclusive(table, work()))

    async def small_fragments(self, record: TableRecord) -> int:
        """How many of the registered version's fragments are below the compaction size."""
        target = self._dataset(record)
        return await asyncio.to_thread(
            _small_fragments, target, record, self.settings.small_fragment_rows
        )

    async def _commit(self, record: TableRecord, outcome: _Outcome, what: str) -> MaintenanceResult:
        current = record
        if outcome.engine_version != record.engine_version:
            self._faults.crash(faults.AFTER_LANCE_WRITE)
            delta = ReferenceDelta.maintenance(
                record.table, record.incarnation, record.version, outcome.engine_version
            )
            # Durable before the registry can point at the new engine version.
            await asyncio.to_thread(self.coordinator.sidecars.write_delta, delta)
            if self.coordinator.digests is not None:
                await asyncio.to_thread(
                    self.coordinator.digests.record_rewrite,
                    record.table,
                    record.incarnation,
                    record.location,
                    record.version,
                    outcome.engine_version,
                )
            commit = MaintenanceCommit(
                table=record.table,
                incarnation=record.incarnation,
                expected_version=record.version,
                expected_engine_version=record.engine_version,
                new_engine_version=outcome.engine_version,
            )
            try:
                current = await self.coordinator.registry.commit_maintenance(commit)
            except (StaleReadVersion, TableNotFound, Unavailable):
                raise  # definitely not applied: the Lance version stays an invisible orphan
            except Exception as exc:
                log.error(
                    "maintenance registry commit failed", table=str(record.table), error=repr(exc)
                )
                raise Unavailable(
                    f"{what} of {record.table} may or may not be registered (its rows are "
                    "the same either way); retry"
                ) from None
            log.info(
                "maintenance committed",
                table=str(record.table),
                what=what,
                version=current.version,
                engine_version=current.engine_version,
                previous_engine_version=record.engine_version,
                fragments_before=outcome.fragments_before,
                fragments_after=outcome.fragments_after,
            )
            await self._retain(current)
        return MaintenanceResult(
            table=record.table,
            changed=current.engine_version != record.engine_version,
            descriptor=current.descriptor(),
            previous_engine_version=record.engine_version,
            fragments_before=outcome.fragments_before,
            fragments_after=outcome.fragments_after,
            indexes=outcome.indexes,
        )

    async def _retain(self, record: TableRecord) -> None:
        try:
            await self.coordinator.engine.cleanup(record.location, record.engine_version)
        except Exception as exc:
            log.warning("retention failed", table=str(record.table), error=repr(exc))


# -- background compaction --------------------------------------------------------------


class AutoCompactor:
    """Compacts tables that accumulated many small fragments, in the background.

    Looks at most every ``interval_s``; a table is examined only when its
    registered version changed since it was last examined, compacted at most
    once per ``min_gap_s``, and one table at a time. Runs only where commits
    may happen (``may_write``: the leader in cloud mode). Failures are logged,
    never raised: an append never depends on it.
    """

    def __init__(
        self, maintenance: Maintenance, *, may_write: Callable[[], bool] = lambda: True
    ) -> None:
        self.maintenance = maintenance
        self.settings = maintenance.settings
        self._may_write = may_write
        self._task: asyncio.Task[None] | None = None
        self._generation: str | None = None
        self._records: list[TableRecord] = []
        self._examined: dict[TableRef, tuple[str, int]] = {}
        self._last_run: dict[TableRef, float] = {}
        self._nudged: set[TableRef] = set()
        self._wake = asyncio.Event()

    def nudge(self, table: TableRef) -> None:
        """Look at ``table`` now: it took many appends (see ``appends_per_look``)."""
        self._nudged.add(table)
        self._wake.set()

    def start(self) -> None:
        if self.settings.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="lake-auto-compaction")
            self.maintenance.coordinator.watch_appends(self.settings.appends_per_look, self.nudge)
            log.info(
                "background compaction on",
                min_small_fragments=self.settings.min_small_fragments,
                interval_s=self.settings.interval_s,
            )

    async def stop(self) -> None:
        """Stop looking for work; a compaction already running finishes (the coordinator drains it)."""
        task, self._task = self._task, None
        self.maintenance.coordinator.watch_appends(0, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.interval_s)
            self._wake.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("background compaction pass failed", error=repr(exc))

    async def tick(self) -> list[TableRef]:
        """One pass; returns the tables compacted."""
        if not self._may_write():
            return []
        registry = self.maintenance.coordinator.registry
        generation, records = await registry.snapshot_if_changed(self._generation)
        if records is not None:
            self._generation, self._records = generation, records
            live = {r.table for r in records}
            self._examined = {t: v for t, v in self._examined.items() if t in live}
            self._last_run = {t: v for t, v in self._last_run.items() if t in live}
        compacted: list[TableRef] = []
        nudged, self._nudged = self._nudged, set()
        for record in self._records:
            seen = (record.incarnation, record.engine_version)
            if self._examined.get(record.table) == seen:
                continue
            now = time.monotonic()
            recent = now - self._last_run.get(record.table, float("-inf")) < self.settings.min_gap_s
            if recent and record.table not in nudged:
                continue  # looked at again on a later pass
            self._examined[record.table] = seen
            try:
                small = await self.maintenance.small_fragments(record)
                if small < self.settings.min_small_fragments:
                    continue
                self._last_run[record.table] = now
                result = await self.maintenance.compact(record.table, automatic=True)
            except LakeError as exc:
                log.info("background compaction skipped", table=str(record.table), error=str(exc))
                continue
            except Exception as exc:
                log.warning(
                    "background compaction failed", table=str(record.table), error=repr(exc)
                )
                continue
            if result.changed:
                compacted.append(record.table)
        return compacted


async def counted_run(kind: str, run: Awaitable[T]) -> T:
    """``await run``, counted in lake_metasrv_maintenance_runs_total by kind and outcome."""
    try:
        result = await run
    except BaseException:
        series.MAINTENANCE_RUNS.inc(kind=kind, outcome="failed")
        raise
    series.MAINTENANCE_RUNS.inc(kind=kind, outcome="ok")
    return result
