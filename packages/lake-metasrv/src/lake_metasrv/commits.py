"""The commit coordinator: the one place where tables change.

Each table has one asyncio lock; everything that changes a table (create,
drop, append) runs under it, in a task shielded from the caller's
cancellation, so a client that hangs up mid-commit cannot leave a Lance
write running while the next commit starts.

An append, in order::

    validate (UUIDv7 id, retention horizon, rows, empty batches)      no I/O
    lock table
      replay: id already committed -> the original result, replayed=True
      table exists, exact schema, read_version is current, FILE cells valid
        and inside the appending tenant's managed-stage prefix (no storage I/O)
      write the reference-delta sidecar (fsync'd)
      Lance append on top of the registered version       [orphan restored first]
      registry compare-and-swap: version -> version + 1    <- visibility point
      retention (failure logged, never fails the commit)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import structlog

from lake_core.errors import (
    CommitStateUnknown,
    InvalidAppend,
    OperationExpired,
    StaleReadVersion,
    TableExists,
    TableNotFound,
    Unavailable,
)
from lake_core.ids import new_operation_id, operation_time_ms, parse_operation_id
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_core.protocol import MAX_APPEND_ROWS, AppendCommand, AppendResult, DropTableResult
from lake_core.schemas import check_exact_schema, schema_to_ipc, validate_table_schema
from lake_metasrv.config import MetaConfig
from lake_metasrv.datadir import DataDir
from lake_metasrv.engine import LanceEngine
from lake_metasrv.registry.base import AppendCommit, RegistryStore, TableRecord
from lake_metasrv.sidecars import DropMarker, ReferenceDelta, SidecarStore, file_uris
from lake_objects.scope import TenantScope
from lake_objects.settings import StageSettings

__all__ = ["MAX_FUTURE_SKEW_MS", "CommitCoordinator"]

log = structlog.get_logger("lake_metasrv.commits")

T = TypeVar("T")
#: An operation id stamped further ahead than this is refused: it would
#: otherwise outlive the retention horizon by the amount of the skew.
MAX_FUTURE_SKEW_MS = 24 * 3600 * 1000
PRUNE_INTERVAL_S = 60.0
CRASH_EXIT_CODE = 137


class CommitCoordinator:
    """Serializes and performs every table change of one Metasrv."""

    def __init__(
        self,
        config: MetaConfig,
        registry: RegistryStore,
        engine: LanceEngine,
        data_dir: DataDir,
        sidecars: SidecarStore,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.registry = registry
        self.engine = engine
        self.data_dir = data_dir
        self.sidecars = sidecars
        self._clock = clock
        self._locks: dict[TableRef, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_prune = float("-inf")
        self._crash_point = config.crash_point
        self.stage = config.stage or StageSettings.local(config.data_dir / "objects")

    @classmethod
    def local(cls, config: MetaConfig, registry: RegistryStore | None = None) -> CommitCoordinator:
        """The embedded setup: SQLite registry, Lance tables and sidecars in ``data_dir``."""
        from lake_metasrv.registry.sqlite import SqliteRegistry

        data_dir = DataDir(config.data_dir)
        return cls(
            config,
            registry if registry is not None else SqliteRegistry(data_dir.registry_path),
            LanceEngine(config.retain_versions),
            data_dir,
            SidecarStore(data_dir.sidecars_root),
        )

    async def open(self) -> None:
        """Open the registry and forget expired operation ids."""
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
        return str(self.data_dir.table_path(table))

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
        log.info("table created", table=str(table), incarnation=incarnation, generation=generation)
        return record

    async def drop_table(self, table: TableRef) -> DropTableResult:
        """Forget a table, then delete its dataset; its sidecars stay for GC."""
        return await self._exclusive(table, self._drop_locked(table))

    async def _drop_locked(self, table: TableRef) -> DropTableResult:
        record = await self.describe_table(table)
        dropped_at = self._now_ms()
        generation = await self.registry.drop_table(table, record.incarnation, dropped_at)
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
        its managed-stage prefix.
        """
        op_time = self._check_operation_id(command.operation_id)
        rows = _check_shape(batches)
        scope = self.stage.scope(tenant_id)
        return await self._exclusive(
            command.table, self._append_locked(command, schema, batches, rows, op_time, scope)
        )

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

    async def _append_locked(
        self,
        command: AppendCommand,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        rows: int,
        op_time: int,
        scope: TenantScope,
    ) -> AppendResult:
        table, operation_id = command.table, command.operation_id
        prior = await self.registry.get_operation(operation_id)
        if prior is not None:
            if prior.table != table:
                raise InvalidAppend(
                    f"operation id {operation_id} was already used for another table"
                )
            log.info("append replayed", table=str(table), version=prior.version)
            return prior.result(replayed=True)

        record = await self.describe_table(table)
        table_schema = record.schema
        check_exact_schema(table_schema, schema, table)
        if command.read_version is not None and command.read_version != record.version:
            raise StaleReadVersion(
                f"append to {table} read version {command.read_version}, "
                f"the table is at version {record.version}"
            )
        data = _conform(batches, schema, table_schema)
        version = record.version + 1
        adds = file_uris(data, table_schema)
        for uri in adds:
            scope.check(uri)
        delta = ReferenceDelta(
            table=table,
            incarnation=record.incarnation,
            version=version,
            operation_id=operation_id,
            adds=adds,
        )
        await asyncio.to_thread(self.sidecars.write_delta, delta)

        self._maybe_crash("before_lance_commit")
        engine_version = await self.engine.append(
            record.location, record.incarnation, record.engine_version, data
        )
        self._maybe_crash("after_lance_commit")
        commit = AppendCommit(
            table=table,
            incarnation=record.incarnation,
            expected_version=record.version,
            engine_version=engine_version,
            operation_id=operation_id,
            operation_time_ms=op_time,
            committed_at_ms=self._now_ms(),
        )
        try:
            updated = await self.registry.commit_append(commit)
        except (InvalidAppend, StaleReadVersion, TableNotFound, Unavailable):
            # A definite "no" (a registry raises Unavailable only when the
            # visibility point was not reached): the Lance version stays an
            # invisible orphan.
            raise
        except Exception as exc:
            log.error("registry commit failed", table=str(table), error=repr(exc))
            raise CommitStateUnknown(
                f"append to {table} may or may not have committed; retry with the same operation id"
            ) from None
        self._maybe_crash("after_registry_commit")
        log.info(
            "append committed",
            table=str(table),
            version=updated.version,
            engine_version=engine_version,
            rows=rows,
        )
        await self._retain(updated)
        await self._prune_operations()
        return AppendResult(
            table=table,
            operation_id=operation_id,
            version=updated.version,
            descriptor=updated.descriptor(),
        )

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

    def _maybe_crash(self, point: str) -> None:
        if self._crash_point == point:
            log.warning("test crash point reached", point=point)
            os._exit(CRASH_EXIT_CODE)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def run_exclusive(self, table: TableRef, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` under the table's lock, to completion even if our caller is cancelled.

        Every change to a table (including maintenance) goes through here.
        """
        return await self._exclusive(table, work)

    async def _exclusive(self, table: TableRef, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` under the table's lock, to completion even if our caller is cancelled."""

        async def locked() -> T:
            lock = self._locks.setdefault(table, asyncio.Lock())
            async with lock:
                return await work

        task = asyncio.ensure_future(locked())
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))
        return await asyncio.shield(task)


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        # Retrieve the outcome so an abandoned failure is logged, not warned about.
        if not task.cancelled() and task.exception() is not None:
            log.debug("table change failed", error=repr(task.exception()))

    return done


def _check_shape(batches: Sequence[pa.RecordBatch]) -> int:
    rows = 0
    for index, batch in enumerate(batches):
        if batch.num_rows == 0:
            raise InvalidAppend(f"batch {index} is empty; every appended batch needs rows")
        rows += batch.num_rows
    if rows == 0:
        raise InvalidAppend("an append needs at least one row")
    if rows > MAX_APPEND_ROWS:
        raise InvalidAppend(f"an append holds at most {MAX_APPEND_ROWS} rows, got {rows}")
    return rows


def _conform(
    batches: Sequence[pa.RecordBatch], wire_schema: pa.Schema, table_schema: pa.Schema
) -> pa.Table:
    """The batches as one table carrying exactly the table's schema and metadata."""
    data = pa.Table.from_batches(batches, schema=wire_schema)
    return pa.Table.from_arrays(data.columns, schema=table_schema)
