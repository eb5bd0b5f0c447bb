"""An append on its way through the commit coordinator: its checks and its records.

The checks here do no I/O; the coordinator (:mod:`lake_metasrv.commits`)
runs them on arrival and again under the table lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog

from lake_core.errors import (
    Aborted,
    CommitStateUnknown,
    InvalidAppend,
    NotLeader,
    StaleReadVersion,
    TableNotFound,
    Unavailable,
)
from lake_core.names import TableRef
from lake_core.protocol import MAX_APPEND_ROWS, AppendCommand, AppendResult
from lake_core.schemas import check_exact_schema
from lake_core.telemetry import series
from lake_core.values import check_batches, check_not_null
from lake_metasrv.engine.base import PreparedAppend
from lake_metasrv.registry.base import OperationRecord, TableRecord
from lake_metasrv.sidecars.base import file_uris
from lake_objects.scope import TenantScope

__all__ = [
    "CheckedRows",
    "Queued",
    "cast_arriving",
    "check_read_version",
    "check_rows",
    "check_shape",
    "conform",
    "fail",
    "observed_append",
    "registry_failure",
    "retrieve",
]

log = structlog.get_logger("lake_metasrv.commits")


@dataclass(frozen=True)
class Queued:
    """An append waiting for its table's committer.

    ``prepared`` is None for an ordinary append: the committer writes its
    rows (``checked.data``) together with the group's other such appends,
    as one data file. An append whose fragments were written before it was
    queued (a bulk ingest) carries them in ``prepared``; the committer
    commits them as they are, in the same version as the rest of its group.
    ``batches`` are only read again if the table was dropped and recreated
    while the append waited (then it is checked again; empty batches with
    ``prepared`` set make such an append fail with Aborted instead).
    """

    command: AppendCommand
    schema: pa.Schema
    batches: Sequence[pa.RecordBatch]
    rows: int
    op_time: int
    scope: TenantScope
    checked: CheckedRows
    prepared: PreparedAppend | None
    future: asyncio.Future[AppendResult]

    @property
    def incarnation(self) -> str:
        """The table incarnation this append was checked (and written) against."""
        return self.prepared.incarnation if self.prepared is not None else self.checked.incarnation


@dataclass(frozen=True)
class CheckedRows:
    """An append's rows in the table's exact schema, and the managed objects they name."""

    data: pa.Table
    adds: list[str]
    #: The table incarnation the rows were checked against.
    incarnation: str = ""


def fail(queued: Queued, error: BaseException) -> None:
    if not queued.future.done():
        queued.future.set_exception(error)


def retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an outcome seen: a caller that went away must not cause a warning."""
    if not future.cancelled():
        future.exception()


def registry_failure(table: TableRef, exc: Exception) -> Exception:
    """What a failed registry commit means to the appender."""
    if isinstance(exc, InvalidAppend | StaleReadVersion | TableNotFound | Unavailable):
        # A definite "no" (a registry raises Unavailable only when the
        # visibility point was not reached): the Lance version stays an
        # invisible orphan.
        return exc
    log.error("registry commit failed", table=str(table), error=repr(exc))
    return CommitStateUnknown(
        f"append to {table} may or may not have committed; retry with the same operation id"
    )


def check_read_version(command: AppendCommand, current: int) -> None:
    if command.read_version is not None and command.read_version != current:
        raise StaleReadVersion(
            f"append to {command.table} read version {command.read_version}, "
            f"the table is at version {current}"
        )


def check_rows(
    record: TableRecord,
    schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    scope: TenantScope,
) -> CheckedRows:
    """Exact schema, no null where a field allows none; FILE cells well-formed and inside
    the tenant's stage. No I/O."""
    table_schema = record.schema
    check_batches(record.table, table_schema, batches)  # value-changing columns, by row
    check_exact_schema(table_schema, schema, record.table)
    check_not_null(record.table, table_schema, batches)
    data = conform(batches, schema, table_schema)
    adds = file_uris(data, table_schema)
    for uri in adds:
        scope.check(uri)
    return CheckedRows(data, adds, record.incarnation)


def cast_arriving(batch: pa.RecordBatch, target: pa.Schema, table: object) -> pa.RecordBatch:
    """``batch`` in the table's layout (an ingest's ``arriving_schema``); InvalidAppend if
    it cannot be."""
    try:
        columns = [_cast_column(c, f.type) for c, f in zip(batch.columns, target, strict=True)]
        return pa.RecordBatch.from_arrays(columns, schema=target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidAppend(f"append to {table}: {exc}") from None


def _cast_column(column: pa.Array, kind: pa.DataType) -> pa.Array:
    if pa.types.is_dictionary(column.type):
        # Decoded after its values are cast: pyarrow cannot take from string_view values.
        values = column.dictionary.cast(kind)
        column = pa.DictionaryArray.from_arrays(column.indices, values).dictionary_decode()
    return column if column.type.equals(kind) else column.cast(kind)


def check_shape(batches: Sequence[pa.RecordBatch]) -> int:
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


def conform(
    batches: Sequence[pa.RecordBatch], wire_schema: pa.Schema, table_schema: pa.Schema
) -> pa.Table:
    """The batches as one table carrying exactly the table's schema and metadata."""
    data = pa.Table.from_batches(batches, schema=wire_schema)
    return pa.Table.from_arrays(data.columns, schema=table_schema)


def replay(prior: OperationRecord, table: TableRef) -> AppendResult:
    """The original result of an operation id seen before (a retry), for the same table."""
    if prior.table != table:
        raise InvalidAppend(f"operation id {prior.operation_id} was already used for another table")
    log.info("append replayed", table=str(table), version=prior.version)
    return prior.result(replayed=True)


async def observed_append(append: Awaitable[AppendResult]) -> AppendResult:
    """``await append``, counting its outcome and latency (lake_metasrv_commits_total)."""
    start = time.perf_counter()
    outcome = "failed"
    try:
        result = await append
        outcome = "replayed" if result.replayed else "committed"
        return result
    except NotLeader:
        outcome = "fenced"
        raise
    except Aborted:
        outcome = "conflicted"  # a stale read version (StaleReadVersion) or a lost race
        raise
    finally:
        series.COMMITS.inc(outcome=outcome)
        series.COMMIT_SECONDS.observe(time.perf_counter() - start, outcome=outcome)
