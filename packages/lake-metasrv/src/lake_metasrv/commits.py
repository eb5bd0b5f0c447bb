"""The commit coordinator: the one place where tables change.

Each table has one asyncio lock; everything that changes a table (create,
drop, append) runs under it, in a task shielded from the caller's
cancellation, so a client that hangs up mid-commit cannot leave a Lance
write running while the next commit starts.

An append, in order::

    validate (UUIDv7 id, retention horizon, rows, empty batches)      no I/O
    queue it for the table's committer, which takes the table lock and
    commits whatever is queued as a group, each append its own version:
      replay: id already committed -> the original result, replayed=True
      table exists, exact schema, read_version is current, FILE cells valid
        and inside the appending tenant's managed-stage prefix (no storage I/O)
      write the reference-delta sidecars (fsync'd)
      Lance: each append's fragments committed on the previous version,
        a compare-and-swap that restores over unregistered orphans  (fsync'd)
      registry compare-and-swap: version -> version + n    <- visibility point
      retention (failure logged, never fails the commit)

Grouping is what makes many small appends cheap: one registry transaction
and one fsync pass serve the whole group, while each append keeps its own
version, its own checks and its own outcome.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import pyarrow as pa
import structlog

from lake_core import faults
from lake_core.errors import (
    Aborted,
    InvalidAppend,
    OperationExpired,
    TableExists,
    TableNotFound,
    Unavailable,
)
from lake_core.ids import new_operation_id, operation_time_ms, parse_operation_id
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_core.protocol import AppendCommand, AppendResult, DropTableResult
from lake_core.schemas import schema_to_ipc, validate_table_schema
from lake_metasrv.appends import (
    CheckedRows,
    Queued,
    Staged,
    check_read_version,
    check_rows,
    check_shape,
    fail,
    registry_failure,
    replay,
    retrieve,
)
from lake_metasrv.config import MetaConfig
from lake_metasrv.datadir import DataDir
from lake_metasrv.engine import AppendOutcome, LanceEngine, LocalLanceEngine, PreparedAppend
from lake_metasrv.gate import OpenGate, WriteGate
from lake_metasrv.integrity import DigestStore, LocalDigestStore
from lake_metasrv.registry.base import AppendCommit, RegistryStore, TableRecord
from lake_metasrv.sidecars import DropMarker, LocalSidecarStore, ReferenceDelta, SidecarStore
from lake_objects.scope import TenantScope
from lake_objects.settings import StageSettings

__all__ = ["MAX_FUTURE_SKEW_MS", "CommitCoordinator"]

log = structlog.get_logger("lake_metasrv.commits")

T = TypeVar("T")
#: An operation id stamped further ahead than this is refused: it would
#: otherwise outlive the retention horizon by the amount of the skew.
MAX_FUTURE_SKEW_MS = 24 * 3600 * 1000
PRUNE_INTERVAL_S = 60.0
#: Appends to one table committed together at most (each its own version).
MAX_GROUP = 64
#: Under a steady stream of appends, retention runs at most this often per table.
RETENTION_INTERVAL_S = 1.0


class CommitCoordinator:
    """Serializes and performs every table change of one Metasrv.

    Its seams are chosen at construction: the registry, the table engine,
    the sidecar store and the write gate (:mod:`lake_metasrv.gate`), which
    every registry-changing operation passes. ``data_dir`` is the local data
    directory to create on open (None in cloud mode).
    """

    def __init__(
        self,
        config: MetaConfig,
        registry: RegistryStore,
        engine: LanceEngine,
        sidecars: SidecarStore,
        *,
        gate: WriteGate | None = None,
        data_dir: DataDir | None = None,
        digests: DigestStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.registry = registry
        self.engine = engine
        self.sidecars = sidecars
        self.gate: WriteGate = gate or OpenGate()
        self.data_dir = data_dir
        #: Size and SHA-256 of every data file a commit writes (local or S3 records).
        if digests is None and data_dir is not None:
            digests = LocalDigestStore.of(data_dir.root, engine)
        self.digests = digests
        self._clock = clock
        self._locks: dict[TableRef, asyncio.Lock] = {}
        self._queues: dict[TableRef, deque[Queued]] = {}
        self._committers: set[TableRef] = set()
        self._retained_at: dict[TableRef, float] = {}
        #: Each table as this coordinator last read or wrote it (a hint: appends
        #: prepare against it, and the committer checks them against the registry).
        self._seen: dict[TableRef, TableRecord] = {}
        self._appended: dict[TableRef, int] = {}
        self._watch_every = 0
        self._on_many_appends: Callable[[TableRef], None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_prune = float("-inf")
        self._faults = config.faults
        self.stage = config.stage or StageSettings.local(config.data_dir / "objects")

    @classmethod
    def local(cls, config: MetaConfig, registry: RegistryStore | None = None) -> CommitCoordinator:
        """The embedded setup: SQLite registry, Lance tables and sidecars in ``data_dir``."""
        from lake_metasrv.registry.sqlite import SqliteRegistry

        data_dir = DataDir(config.data_dir)
        return cls(
            config,
            registry if registry is not None else SqliteRegistry(data_dir.registry_path),
            LocalLanceEngine(config.retain_versions, data_dir.tables_root),
            LocalSidecarStore(data_dir.sidecars_root),
            data_dir=data_dir,
        )

    async def open(self) -> None:
        """Open the registry and forget expired operation ids (where this node writes)."""
        if self.data_dir is not None:
            self.data_dir.create()
        await self.registry.open()
        await self._prune_operations(force=True)

    async def close(self, drain_timeout_s: float | None = None) -> None:
        """Let running commits finish (up to ``drain_timeout_s``), then close the registry.

        A commit still running after that fails at its registry step, which
        leaves at most an invisible Lance orphan, restored over on the next append.
        """
        await self.drain(drain_timeout_s)
        await self.registry.close()

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for commits whose callers went away; False if some are still running."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        return not pending

    # -- reads --------------------------------------------------------------

    async def describe_table(self, table: TableRef) -> TableRecord:
        record = await self.registry.get_table(table)
        if record is None:
            raise TableNotFound(table)
        return record

    def location_for(self, table: TableRef) -> str:
        return self.engine.location(table)

    # -- create / drop ------------------------------------------------------

    async def create_table(self, table: TableRef, schema: pa.Schema) -> TableRecord:
        """Create an empty table (Lake version 0); raise TableExists if it is live."""
        schema = validate_table_schema(schema).remove_metadata()
        return await self._exclusive(table, self._create_locked(table, schema))

    async def _create_locked(self, table: TableRef, schema: pa.Schema) -> TableRecord:
        if await self.registry.get_table(table) is not None:
            raise TableExists(table)
        incarnation = new_operation_id()
        location = self.location_for(table)
        engine_version = await self.engine.create(location, schema, incarnation)
        delta = ReferenceDelta(table=table, incarnation=incarnation, version=0, adds=[])
        await asyncio.to_thread(self.sidecars.write_delta, delta)
        record = TableRecord(
            table=table,
            incarnation=incarnation,
            location=location,
            engine=self.engine.name,
            schema_ipc=schema_to_ipc(schema),
            version=0,
            engine_version=engine_version,
            created_at_ms=self._now_ms(),
        )
        generation = await self.registry.create_table(record)
        self._seen[table] = record
        log.info("table created", table=str(table), incarnation=incarnation, generation=generation)
        return record

    async def drop_table(self, table: TableRef) -> DropTableResult:
        """Forget a table, then delete its dataset; its sidecars stay for GC."""
        return await self._exclusive(table, self._drop_locked(table))

    async def _drop_locked(self, table: TableRef) -> DropTableResult:
        record = await self.describe_table(table)
        dropped_at = self._now_ms()
        generation = await self.registry.drop_table(table, record.incarnation, dropped_at)
        self._seen.pop(table, None)
        # Only after the registry forgot the table: a marker for a live table
        # would let GC delete objects it still references.
        marker = DropMarker(
            table=table,
            incarnation=record.incarnation,
            dropped_version=record.version,
            dropped_at_ms=dropped_at,
        )
        try:
            await asyncio.to_thread(self.sidecars.write_drop, marker)
            await self.engine.remove(record.location)
        except OSError as exc:
            log.warning("dropped table cleanup failed", table=str(table), error=str(exc))
        log.info("table dropped", table=str(table), version=record.version, generation=generation)
        return DropTableResult(table=table, dropped_version=record.version)

    # -- append ---------------------------------------------------------------

    async def append(
        self,
        command: AppendCommand,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        *,
        tenant_id: str = DEV_PRINCIPAL.tenant_id,
    ) -> AppendResult:
        """Commit ``batches`` as the table's next version, at most once per operation id.

        The caller enforces the 64 MiB encoded-payload cap (the Flight decoder
        does); everything else about the append is checked here. ``tenant_id``
        is the appending principal's tenant: FILE cells must name objects in
        its managed-stage prefix. Concurrent appends to one table are
        committed as a group (see :meth:`_commit_group`); each still gets its
        own version and its own outcome.
        """
        self.gate.check()  # before anything is read or written for it
        op_time = self._check_operation_id(command.operation_id)
        rows = check_shape(batches)
        scope = self.stage.scope(tenant_id)
        # Runs to completion even if our caller goes away: once started, an
        # append is never abandoned half-way.
        return await self._shielded(self._append(command, schema, batches, rows, op_time, scope))

    async def _append(
        self,
        command: AppendCommand,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        rows: int,
        op_time: int,
        scope: TenantScope,
    ) -> AppendResult:
        prior = await self.registry.get_operation(command.operation_id)
        if prior is not None:
            return replay(prior, command.table)
        # Checked and written as fragments outside the lock, concurrently with
        # other appends; the committer only has to commit them.
        # The table as last seen is enough here (everything is checked again
        # under the lock), and spares every append a registry read.
        record = self._seen.get(command.table)
        if record is None:
            record = await self.describe_table(command.table)
            self._seen[command.table] = record
        if command.read_version is not None and command.read_version < record.version:
            check_read_version(command, record.version)  # stale already: versions only grow
        checked = check_rows(record, schema, batches, scope)
        prepared = await self.engine.prepare(
            record.location, record.incarnation, record.engine_version, checked.data
        )
        return await self._enqueue(
            command, schema, batches, rows, op_time, scope, checked, prepared
        )

    async def append_prepared(
        self,
        command: AppendCommand,
        schema: pa.Schema,
        rows: int,
        checked: CheckedRows,
        prepared: PreparedAppend,
        *,
        tenant_id: str = DEV_PRINCIPAL.tenant_id,
    ) -> AppendResult:
        """Commit rows already checked and written as fragments (a bulk ingest's) as one append.

        The caller checked them by :func:`check_rows`' rules and wrote them with
        ``engine.prepare_stream`` (:mod:`lake_metasrv.ingest`); from here they are
        an append like any other: one version, one operation id, no row cap.
        """
        self.gate.check()
        op_time = self._check_operation_id(command.operation_id)
        scope = self.stage.scope(tenant_id)
        return await self._shielded(
            self._enqueue(command, schema, (), rows, op_time, scope, checked, prepared)
        )

    async def _enqueue(
        self,
        command: AppendCommand,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        rows: int,
        op_time: int,
        scope: TenantScope,
        checked: CheckedRows,
        prepared: PreparedAppend,
    ) -> AppendResult:
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        future.add_done_callback(retrieve)
        self._queues.setdefault(command.table, deque()).append(
            Queued(command, schema, batches, rows, op_time, scope, checked, prepared, future)
        )
        self._start_committer(command.table)
        return await future

    def _check_operation_id(self, operation_id: str) -> int:
        parse_operation_id(operation_id)
        op_time = operation_time_ms(operation_id)
        now = self._now_ms()
        if op_time < now - self.config.operation_retention_secs * 1000:
            raise OperationExpired(
                f"operation id {operation_id} is older than the retention horizon of "
                f"{self.config.operation_retention_secs} s; start a new operation"
            )
        if op_time > now + MAX_FUTURE_SKEW_MS:
            raise InvalidAppend(f"operation id {operation_id} is stamped in the future")
        return op_time

    def _start_committer(self, table: TableRef) -> None:
        if table in self._committers:
            return
        self._committers.add(table)
        task = asyncio.ensure_future(self._committer(table))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_abandoned)

    async def _committer(self, table: TableRef) -> None:
        """Commit the table's queued appends, a group at a time, under its lock."""
        queue = self._queues[table]
        lock = self._locks.setdefault(table, asyncio.Lock())
        try:
            while queue:
                # The lock is taken per group: a create, drop or maintenance
                # waiting for it (the lock is FIFO) goes before the next group.
                async with lock:
                    group = [queue.popleft() for _ in range(min(len(queue), MAX_GROUP))]
                    try:
                        retry = await self._commit_group(table, group)
                    except BaseException as exc:
                        # A bug, or cancellation at shutdown: nobody may wait forever.
                        error = (
                            exc
                            if isinstance(exc, Exception)
                            else Unavailable(
                                "Metasrv is shutting down; retry with the same operation id"
                            )
                        )
                        for queued in group:
                            fail(queued, error)
                        raise
                    queue.extendleft(reversed(retry))
        finally:
            self._committers.discard(table)
            if queue:
                self._start_committer(table)
            else:
                self._queues.pop(table, None)

    def _write_side_records(self, record: TableRecord, staged: Sequence[Staged]) -> None:
        """The staged versions' reference-delta sidecars, then their digests (blocking)."""
        self.sidecars.write_deltas([s.delta for s in staged])
        self._record_digests(record, staged)

    def _record_digests(self, record: TableRecord, staged: Sequence[Staged]) -> None:
        """Hash the data files each staged version adds (blocking)."""
        if self.digests is not None:
            self.digests.record(
                record.table,
                record.incarnation,
                record.location,
                [(s.version, s.queued.prepared.fragments) for s in staged],
            )

    async def _commit_group(self, table: TableRef, group: list[Queued]) -> list[Queued]:
        """Commit ``group`` in order, each append its own version; return those to retry.

        The group shares one registry read, one sidecar directory fsync, one
        run of Lance commits with one fsync pass, one registry transaction
        (where the registry has multi-append transactions) and one retention
        pass. Every append is validated on its own, exactly as if it came
        alone: a bad one fails by itself and does not hold a version number.
        While more appends are waiting, retention runs at most every
        :data:`RETENTION_INTERVAL_S` (a table then briefly keeps more than
        its window, never fewer versions).
        """
        try:
            self.gate.check()  # again: the lease may have gone while these waited
            record = await self.describe_table(table)
        except Exception as exc:
            self._seen.pop(table, None)
            for queued in group:
                fail(queued, exc)
            return []
        self._seen[table] = record
        staged, retry = await self._stage(record, group)
        if not staged:
            return retry
        # Sidecars and Lance commits are independent; both must be durable
        # before the registry moves. A failure of either leaves only orphans.
        # The sidecars and the digests share one thread: a third busy thread
        # beside the commits slowed them more than it saved (1.08x appends/s
        # with one, embedded, 8 in flight; docs/performance-analysis.md).
        self._faults.crash(faults.BEFORE_LANCE_COMMIT)
        beside, outcome = await asyncio.gather(
            asyncio.to_thread(self._write_side_records, record, staged),
            self.engine.append_many(
                record.location,
                record.incarnation,
                record.engine_version,
                [s.queued.prepared for s in staged],
            ),
            return_exceptions=True,
        )
        for failure in (beside, outcome):
            if isinstance(failure, BaseException):
                for item in staged:
                    fail(item.queued, failure)
                return retry
        assert isinstance(outcome, AppendOutcome)
        self._faults.crash(faults.AFTER_LANCE_COMMIT)
        written = staged[: len(outcome.versions)]
        if outcome.error is not None:
            # The Lance write of this one failed; those after it were never tried.
            fail(staged[len(written)].queued, outcome.error)
            retry.extend(s.queued for s in staged[len(written) + 1 :])
        committed_at = self._now_ms()
        commits = [
            AppendCommit(
                table=table,
                incarnation=record.incarnation,
                expected_version=item.version - 1,
                engine_version=engine_version,
                operation_id=item.queued.command.operation_id,
                operation_time_ms=item.queued.op_time,
                committed_at_ms=committed_at,
            )
            for item, engine_version in zip(written, outcome.versions, strict=True)
        ]
        done: list[tuple[Staged, TableRecord]] = []
        batch = self.registry.atomic_append_batch
        for start in range(0, len(commits), batch):
            chunk = written[start : start + batch]
            try:
                updated = await self.registry.commit_appends(commits[start : start + batch])
            except Exception as exc:
                error = registry_failure(table, exc)
                for item in chunk:
                    fail(item.queued, error)
                # Never tried: their Lance versions are orphans, restored over on retry.
                retry.extend(s.queued for s in written[start + batch :])
                break
            self._faults.crash(faults.AFTER_REGISTRY_COMMIT)
            done.extend(zip(chunk, updated, strict=True))
        if done:
            last = done[-1][1]
            log.info(
                "appends committed",
                table=str(table),
                count=len(done),
                version=last.version,
                engine_version=last.engine_version,
                rows=sum(item.queued.rows for item, _ in done),
            )
            now = time.monotonic()
            busy = bool(self._queues.get(table))  # appends arrived while this group committed
            if not busy or now - self._retained_at.get(table, 0.0) >= RETENTION_INTERVAL_S:
                # Before replying: once a lone append is acknowledged, its
                # retention has happened.
                self._retained_at[table] = now
                await self._retain(last)
        for item, result in done:
            item.queued.future.set_result(
                AppendResult(
                    table=table,
                    operation_id=item.queued.command.operation_id,
                    version=result.version,
                    descriptor=result.descriptor(),
                )
            )
        if done:
            self._seen[table] = done[-1][1]
            self._count_appends(table, len(done))
        await self._prune_operations()
        return retry

    async def _stage(
        self, record: TableRecord, group: list[Queued]
    ) -> tuple[list[Staged], list[Queued]]:
        """Check each queued append against the table; assign versions to the good ones.

        Returns the staged appends and those to retry after this group (a
        second use of an operation id that is in this very group).
        """
        staged: list[Staged] = []
        retry: list[Queued] = []
        in_group: set[str] = set()
        version = record.version
        priors = await self.registry.get_operations([q.command.operation_id for q in group])
        for queued in group:
            command = queued.command
            if command.operation_id in in_group:
                retry.append(queued)  # answered as a replay once the first one lands
                continue
            try:
                prior = priors.get(command.operation_id)
                if prior is not None:
                    queued.future.set_result(replay(prior, record.table))
                    continue
                if queued.prepared.incarnation != record.incarnation:
                    if not queued.batches:  # written from a stream (append_prepared)
                        raise Aborted(f"{record.table} was dropped and recreated meanwhile")
                    # The table was dropped and recreated since: check and write again.
                    checked = check_rows(record, queued.schema, queued.batches, queued.scope)
                    prepared = await self.engine.prepare(
                        record.location, record.incarnation, record.engine_version, checked.data
                    )
                    queued = replace(queued, checked=checked, prepared=prepared)
                delta = self._stage_version(record, queued, version + 1)
            except Exception as exc:
                fail(queued, exc)
                continue
            version += 1
            in_group.add(command.operation_id)
            staged.append(Staged(queued, version, delta))
        return staged, retry

    def _stage_version(self, record: TableRecord, queued: Queued, version: int) -> ReferenceDelta:
        """Check ``queued`` may become ``version``; its reference delta. No I/O."""
        command = queued.command
        check_read_version(command, version - 1)
        return ReferenceDelta(
            table=record.table,
            incarnation=record.incarnation,
            version=version,
            operation_id=command.operation_id,
            adds=queued.checked.adds,
        )

    def watch_appends(self, every: int, callback: Callable[[TableRef], None] | None) -> None:
        """Call ``callback(table)`` each time a table took ``every`` more appends (0: stop)."""
        self._watch_every, self._on_many_appends = every, callback
        self._appended.clear()

    def _count_appends(self, table: TableRef, count: int) -> None:
        if self._on_many_appends is None or self._watch_every <= 0:
            return
        total = self._appended.get(table, 0) + count
        if total >= self._watch_every:
            total = 0
            self._on_many_appends(table)
        self._appended[table] = total

    # -- housekeeping -----------------------------------------------------------

    async def _retain(self, record: TableRecord) -> None:
        try:
            removed = await self.engine.cleanup(record.location, record.engine_version)
        except Exception as exc:
            log.warning("retention failed", table=str(record.table), error=repr(exc))
            return
        if removed:
            log.info("old versions reclaimed", table=str(record.table), versions=removed)

    async def _prune_operations(self, *, force: bool = False) -> None:
        if not self.gate.is_open():
            return  # the writer's job (the leader's in cloud mode)
        now = time.monotonic()
        if not force and now - self._last_prune < PRUNE_INTERVAL_S:
            return
        self._last_prune = now
        horizon = self._now_ms() - self.config.operation_retention_secs * 1000
        try:
            pruned = await self.registry.prune_operations(horizon)
        except Exception as exc:
            log.warning("pruning operation ids failed", error=repr(exc))
            return
        if pruned:
            log.info("expired operation ids pruned", count=pruned)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def run_exclusive(self, table: TableRef, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` under the table's lock, to completion even if our caller is cancelled.

        Every change to a table but an append (including maintenance) goes
        through here; appends take the lock in their table's committer. Both
        pass the write gate first.
        """
        return await self._exclusive(table, work)

    async def _exclusive(self, table: TableRef, work: Coroutine[Any, Any, T]) -> T:
        try:
            self.gate.check()
        except BaseException:
            work.close()  # never started: do not leave a coroutine un-awaited
            raise

        async def locked() -> T:
            lock = self._locks.setdefault(table, asyncio.Lock())
            async with lock:
                return await work

        return await self._shielded(locked())

    async def _shielded(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` as a task that finishes even if our caller is cancelled."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_abandoned)
        return await asyncio.shield(task)


def _log_abandoned(task: asyncio.Task[Any]) -> None:
    # Retrieve the outcome so an abandoned failure is logged, not warned about.
    if not task.cancelled() and task.exception() is not None:
        log.debug("table change failed", error=repr(task.exception()))
