"""The commit coordinator: the one place where tables change.

Each table has one asyncio lock; everything that changes a table (create,
drop, append) runs under it, in a task shielded from the caller's
cancellation, so a client that hangs up mid-commit cannot leave a Lance
write running while the next commit starts.

An append, in order::

    validate (UUIDv7 id, retention horizon, rows, empty batches)      no I/O
    check its rows against the table as last seen                     no I/O
    queue it for the table's committer, which takes the table lock and
    commits whatever queued meanwhile as ONE version (a commit group):
      replay: id already committed -> the original result, replayed=True
      per append: table incarnation, read_version, exact schema, FILE
        cells inside the tenant's managed-stage prefix; a bad one is
        refused alone, the others go on
      the group's rows written together (one fragment), ingest fragments
        already written join as they are                            (fsync'd)
      one merged reference-delta sidecar (every append's adds and ids)
      Lance: one Append of every fragment on the registered version,
        a compare-and-swap that restores over unregistered orphans  (fsync'd)
      registry compare-and-swap: version -> version + 1, one operation
        record per append, all or none               <- visibility point
      retention (failure logged, never fails the commit)

A group is whatever queued while the previous commit of the table ran (a
lone append never waits), bounded by ``LAKE_COMMIT_GROUP_MAX_APPENDS`` and
``LAKE_COMMIT_GROUP_MAX_ROWS``. Every append still gets its own outcome:
the version its rows became visible at (shared by its group), its own
checks, and its own operation record, so a retry returns that version.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    CommitStateUnknown,
    InvalidAppend,
    OperationExpired,
    TableExists,
    TableNotFound,
    Unavailable,
    is_failure,
)
from lake_core.ids import new_operation_id, operation_time_ms, parse_operation_id
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_core.protocol import AppendCommand, AppendResult, DropTableResult
from lake_core.schemas import schema_to_ipc, validate_table_schema
from lake_core.telemetry import series
from lake_metasrv.appends import (
    CheckedRows,
    Queued,
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
from lake_metasrv.digests.base import DigestStore
from lake_metasrv.digests.local import LocalDigestStore
from lake_metasrv.engine.base import LanceEngine, PreparedAppend
from lake_metasrv.engine.local import LocalLanceEngine
from lake_metasrv.gate import OpenGate, WriteGate
from lake_metasrv.registry.base import (
    AppendCommit,
    AppendOperation,
    OperationRecord,
    RegistryStore,
    TableRecord,
)
from lake_metasrv.sidecars.base import DropMarker, ReferenceDelta, SidecarStore
from lake_metasrv.sidecars.local import LocalSidecarStore
from lake_objects.scope import TenantScope
from lake_objects.settings import StageSettings

__all__ = ["MAX_FUTURE_SKEW_MS", "CommitCoordinator"]

log = structlog.get_logger("lake_metasrv.commits")

T = TypeVar("T")
#: An operation id stamped further ahead than this is refused: it would
#: otherwise outlive the retention horizon by the amount of the skew.
MAX_FUTURE_SKEW_MS = 24 * 3600 * 1000
PRUNE_INTERVAL_S = 60.0
#: Longest a committer waits for appends under the test-only ``meta.commit_group_gather``.
GATHER_LIMIT_S = 10.0
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
        #: Set whenever an append is queued (only awaited under a test-only fault setting).
        self._arrived = asyncio.Event()
        self._retained_at: dict[TableRef, float] = {}
        #: Appends whose group's rows Lance refused: each is retried in a group of its own.
        self._alone: set[str] = set()
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
            LocalLanceEngine(
                config.retain_versions,
                data_dir.tables_root,
                retain_min_age_secs=config.retain_min_age_secs,
            ),
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
        own checks and its own outcome, and shares its group's version.
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
        # Checked outside the lock, concurrently with other appends, against
        # the table as last seen (enough here: the committer checks the
        # incarnation again, and this spares every append a registry read).
        # A retry is answered by the committer, which reads the operation ids
        # of its whole group at once; only an append these checks refuse is
        # looked up here, so a retry still gets its original result.
        # The committer writes the group's rows together.
        try:
            record = self._seen.get(command.table)
            if record is None:
                record = await self.describe_table(command.table)
                self._seen[command.table] = record
            if command.read_version is not None and command.read_version < record.version:
                check_read_version(command, record.version)  # stale already: versions only grow
            checked = check_rows(record, schema, batches, scope)
        except Exception:
            prior = await self.registry.get_operation(command.operation_id)
            if prior is not None:
                return replay(prior, command.table)
            raise
        return await self._enqueue(command, schema, batches, rows, op_time, scope, checked, None)

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
        prepared: PreparedAppend | None,
    ) -> AppendResult:
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self.enqueue(
            Queued(command, schema, batches, rows, op_time, scope, checked, prepared, future)
        )
        return await future

    def enqueue(self, queued: Queued) -> None:
        """Queue an append checked (and possibly written) by the caller for its group.

        For appends that arrive some other way than :meth:`append` (a bulk
        ingest whose fragments were written while it streamed in:
        ``queued.prepared``). The caller awaits ``queued.future``; the
        committer checks it against the table like any other append.
        """
        queued.future.add_done_callback(retrieve)
        self._queues.setdefault(queued.command.table, deque()).append(queued)
        self._start_committer(queued.command.table)

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
        self._arrived.set()
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
                await self._gather_for_tests(queue)
                # The lock is taken per group: a create, drop or maintenance
                # waiting for it (the lock is FIFO) goes before the next group.
                async with lock:
                    group = self._next_group(queue)
                    try:
                        retry = await self._commit_group(table, group)
                    except BaseException as exc:
                        # A bug (a Rust panic is a BaseException too), or cancellation
                        # at shutdown: nobody may wait forever.
                        error: BaseException = exc
                        if not isinstance(exc, Exception):
                            error = (
                                CommitStateUnknown(
                                    f"append to {table} failed inside the storage engine; "
                                    "retry with the same operation id"
                                )
                                if is_failure(exc)
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

    async def _gather_for_tests(self, queue: deque[Queued]) -> None:
        """Under the test-only fault setting ``meta.commit_group_gather``: wait for a full group."""
        wanted = self._faults.setting(faults.COMMIT_GROUP_GATHER)
        if wanted is None:
            return
        deadline = time.monotonic() + GATHER_LIMIT_S
        while len(queue) < wanted and time.monotonic() < deadline:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), deadline - time.monotonic())

    def _next_group(self, queue: deque[Queued]) -> list[Queued]:
        """The appends queued now, up to the group bounds (at least one)."""
        if queue and queue[0].command.operation_id in self._alone:
            self._alone.discard(queue[0].command.operation_id)
            return [queue.popleft()]
        group: list[Queued] = []
        rows = 0
        while queue and len(group) < self.config.group_max_appends:
            if queue[0].command.operation_id in self._alone:
                break
            # Rows written by the committer count; fragments written before
            # queueing (an ingest) are committed as they are.
            more = queue[0].rows if queue[0].prepared is None else 0
            if group and rows + more > self.config.group_max_rows:
                break
            group.append(queue.popleft())
            rows += more
        return group

    async def _commit_group(self, table: TableRef, group: list[Queued]) -> list[Queued]:
        """Commit ``group`` as ONE version; return the appends to retry after it.

        Every append is checked on its own, exactly as if it came alone: a
        bad one fails by itself and takes no part in the version. The good
        ones share one registry read, one fragment write (their rows
        concatenated), one merged sidecar, one Lance commit with one fsync
        pass, one registry compare-and-swap and one retention pass; each gets
        the shared version as its result. While more appends are waiting,
        retention runs at most every :data:`RETENTION_INTERVAL_S` (a table
        then briefly keeps more than its window, never fewer versions).
        """
        try:
            self.gate.check()  # again: the lease may have gone while these waited
            # The table and the group's earlier commits (retries), read together.
            found, priors = await self.registry.get_table_and_operations(
                table, [q.command.operation_id for q in group]
            )
            if found is None:
                raise TableNotFound(table)
            record = found
        except Exception as exc:
            self._seen.pop(table, None)
            for queued in group:
                fail(queued, exc)
            return []
        self._seen[table] = record
        staged, retry = await self._stage(record, group, priors)
        if not staged:
            return retry
        version = record.version + 1
        ids = [queued.command.operation_id for queued in staged]
        delta = ReferenceDelta(
            table=table,
            incarnation=record.incarnation,
            version=version,
            operation_id=ids[0],
            operation_ids=ids,
            adds=sorted({uri for queued in staged for uri in queued.checked.adds}),
        )
        series.COMMIT_GROUP_SIZE.observe(len(staged))
        # The sidecar and the rows + Lance commit are independent; both must
        # be durable before the registry moves. A failure of either leaves
        # only orphans (an unregistered Lance version, restored over next time).
        self._faults.crash(faults.BEFORE_LANCE_COMMIT)
        beside, outcome = await asyncio.gather(
            asyncio.to_thread(self.sidecars.write_deltas, [delta]),
            self._write_and_commit(record, version, staged, ids),
            return_exceptions=True,
        )
        if isinstance(outcome, _RowsRefused) and not isinstance(beside, BaseException):
            # Lance refused the group's rows together, though each append passed its
            # checks: one of them is bad in a way the checks missed. Each goes again
            # alone, so it fails by itself and the others commit (a version apiece).
            log.warning("group rows refused; retrying its appends alone", table=str(table))
            self._alone.update(q.command.operation_id for q in staged)
            return [*staged, *retry]
        for failure in (beside, outcome):
            if isinstance(failure, BaseException):
                error = failure.error if isinstance(failure, _RowsRefused) else failure
                for queued in staged:
                    fail(queued, error)
                return retry
        assert isinstance(outcome, int)
        self._faults.crash(faults.AFTER_LANCE_COMMIT)
        commit = AppendCommit.of_group(
            table,
            record.incarnation,
            record.version,
            outcome,
            [AppendOperation(q.command.operation_id, q.op_time) for q in staged],
            self._now_ms(),
        )
        try:
            updated = await self.registry.commit_append(commit)
        except Exception as exc:
            error = registry_failure(table, exc)
            for queued in staged:
                fail(queued, error)
            return retry
        self._faults.crash(faults.AFTER_REGISTRY_COMMIT)
        log.info(
            "appends committed",
            table=str(table),
            count=len(staged),
            version=updated.version,
            engine_version=updated.engine_version,
            rows=sum(queued.rows for queued in staged),
        )
        now = time.monotonic()
        busy = bool(self._queues.get(table))  # appends arrived while this group committed
        if not busy or now - self._retained_at.get(table, 0.0) >= RETENTION_INTERVAL_S:
            # Before replying: once a lone append is acknowledged, its
            # retention has happened.
            self._retained_at[table] = now
            await self._retain(updated)
        for queued in staged:
            queued.future.set_result(
                AppendResult(
                    table=table,
                    operation_id=queued.command.operation_id,
                    version=updated.version,
                    descriptor=updated.descriptor(),
                )
            )
        self._seen[table] = updated
        self._count_appends(table, len(staged))
        await self._prune_operations()
        return retry

    async def _write_and_commit(
        self, record: TableRecord, version: int, staged: list[Queued], ids: list[str]
    ) -> int:
        """Write the group's rows as one fragment, then commit every fragment as one version.

        The fragment's data file is fsync'd with the new manifest, in the
        commit's one fsync pass. The data files' digests are recorded while
        Lance commits. Both run to the end before this returns, even when
        one fails: nothing of a failed group may still be writing when the
        next one starts.
        """
        prepared = [queued.prepared for queued in staged if queued.prepared is not None]
        rows = [queued.checked.data for queued in staged if queued.prepared is None]
        if rows:
            data = rows[0] if len(rows) == 1 else pa.concat_tables(rows)
            try:
                written = await self.engine.prepare(
                    record.location, record.incarnation, record.engine_version, data, sync=False
                )
            except Exception as exc:
                if len(rows) > 1:
                    raise _RowsRefused(exc) from exc
                raise
            prepared.append(written)
        digests, committed = await asyncio.gather(
            asyncio.to_thread(self._record_digests, record, version, prepared),
            self.engine.commit_group(
                record.location, record.incarnation, record.engine_version, prepared, ids
            ),
            return_exceptions=True,
        )
        for failure in (digests, committed):
            if isinstance(failure, BaseException):
                raise failure
        assert isinstance(committed, int)
        return committed

    def _record_digests(
        self, record: TableRecord, version: int, prepared: list[PreparedAppend]
    ) -> None:
        """Hash the data files the group's version adds (blocking)."""
        if self.digests is not None:
            fragments = [fragment for append in prepared for fragment in append.fragments]
            self.digests.record(
                record.table, record.incarnation, record.location, [(version, fragments)]
            )

    async def _stage(
        self, record: TableRecord, group: list[Queued], priors: dict[str, OperationRecord]
    ) -> tuple[list[Queued], list[Queued]]:
        """Check each queued append against the table; return the good ones and those to retry.

        Retried after this group: a second use of an operation id that is in
        this very group (answered as a replay once the first lands), and a
        conditional append (``read_version``) when another conditional one
        already holds this version: conditional appends are considered first,
        and at most one shares a version (the others are then stale).
        """
        staged: list[Queued] = []
        retry: list[Queued] = []
        in_group: set[str] = set()
        conditional = False
        for queued in sorted(group, key=lambda q: q.command.read_version is None):
            command = queued.command
            if command.operation_id in in_group:
                retry.append(queued)
                continue
            try:
                prior = priors.get(command.operation_id)
                if prior is not None:
                    queued.future.set_result(replay(prior, record.table))
                    continue
                if command.read_version is not None:
                    check_read_version(command, record.version)
                    if conditional:
                        retry.append(queued)
                        continue
                    conditional = True
                queued = await self._recheck(record, queued)
            except Exception as exc:
                fail(queued, exc)
                continue
            in_group.add(command.operation_id)
            staged.append(queued)
        return staged, retry

    async def _recheck(self, record: TableRecord, queued: Queued) -> Queued:
        """``queued`` checked against ``record``'s incarnation (again, if it changed)."""
        if queued.incarnation == record.incarnation:
            return queued
        if not queued.batches:
            raise Aborted(
                f"table {record.table} was dropped and recreated while the append was "
                "staged; send it again"
            )
        # The table was dropped and recreated since: check the rows again.
        checked = check_rows(record, queued.schema, queued.batches, queued.scope)
        return replace(queued, checked=checked, prepared=None)

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


class _RowsRefused(Exception):
    """Writing several appends' rows together failed (``error``): retry them alone."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _log_abandoned(task: asyncio.Task[Any]) -> None:
    # Retrieve the outcome so an abandoned failure is logged, not warned about.
    if not task.cancelled() and task.exception() is not None:
        log.debug("table change failed", error=repr(task.exception()))
