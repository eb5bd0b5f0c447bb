"""Appends: local validation, at-most-once retries and durable pending appends.

Every append carries a UUIDv7 operation id. A failure whose outcome is
unknown (transport errors, ``CommitStateUnknown``) is retried with the same
id, so the append commits at most once. With an upload checkpoint directory
the append is first written to a :class:`~lake_sdk._pending.PendingAppendStore`
and removed once its outcome is conclusive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import structlog

from lake_core import protocol
from lake_core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidAppend,
    InvalidArgument,
    LakeError,
    NotFound,
    PermissionDenied,
    StaleReadVersion,
    Unimplemented,
)
from lake_core.ids import parse_operation_id
from lake_core.names import TableRef
from lake_core.schemas import check_exact_schema
from lake_core.values import check_batches
from lake_sdk._pending import PendingAppendStore, maybe_crash
from lake_sdk._transport import Transport

__all__ = [
    "DEFAULT_APPEND_RETRIES",
    "MAX_APPEND_RETRIES",
    "Appender",
    "is_conclusive",
    "validate_append",
]

log = structlog.get_logger("lake_sdk")

DEFAULT_APPEND_RETRIES = 2
MAX_APPEND_RETRIES = 9


def is_conclusive(error: LakeError) -> bool:
    """True when the server definitely did not (and will never) commit this operation.

    Explicit rejections are conclusive, including "operation expired" past the
    retention horizon. Transport failures, unknown commit states, timeouts and
    undecodable replies are not: the append may have committed.
    """
    return isinstance(
        error,
        InvalidArgument
        | NotFound
        | AlreadyExists
        | FailedPrecondition
        | PermissionDenied
        | StaleReadVersion
        | Unimplemented,
    )


def batch_list(batches: Any) -> list[Any]:
    """``batches`` (an iterable of RecordBatches, or a Table) as a list, or InvalidAppend.

    A lone RecordBatch is refused by name: iterating it would yield its
    columns, and the error would then blame "batch 0" for being an array.
    """
    if isinstance(batches, pa.Table):
        return list(batches.to_batches())
    if isinstance(batches, pa.RecordBatch | str | bytes) or not isinstance(batches, Iterable):
        raise InvalidAppend(
            "batches must be an iterable of pyarrow.RecordBatch or a pyarrow.Table, "
            f"not {type(batches).__name__}"
        )
    return list(batches)


def validate_append(
    table: TableRef, schema: pa.Schema, batches: Sequence[pa.RecordBatch]
) -> list[pa.RecordBatch]:
    """Check Lake's append bounds locally, before anything is sent."""
    if not batches:
        raise InvalidAppend(f"append to {table} has no batches")
    rows = 0
    encoded = 0
    for i, batch in enumerate(batches):
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidAppend(f"batch {i} is a {type(batch).__name__}, not a pyarrow.RecordBatch")
        if batch.num_rows == 0:
            raise InvalidAppend(f"batch {i} of the append to {table} is empty")
        check_batches(table, schema, [batch], first_row=rows)  # named by row and column
        check_exact_schema(schema, batch.schema, table)
        rows += batch.num_rows
        if rows > protocol.MAX_APPEND_ROWS:
            raise InvalidAppend(
                f"append to {table} has more than {protocol.MAX_APPEND_ROWS:,} rows"
            )
        encoded += pa.ipc.get_record_batch_size(batch)
        if encoded > protocol.MAX_APPEND_BYTES:
            raise InvalidAppend(
                f"append to {table} encodes to more than {protocol.MAX_APPEND_BYTES // 2**20} MiB"
            )
    # Send the table's own schema (FILE markers included) so the server's check is exact.
    return [pa.RecordBatch.from_arrays(batch.columns, schema=schema) for batch in batches]


class Appender:
    """Sends appends through one connection; shared by a client and its clones."""

    def __init__(
        self,
        connection: Transport,
        *,
        retries: int,
        pending: PendingAppendStore | None,
        schema_changed: Callable[[TableRef], None],
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise InvalidArgument("retries must be an integer")
        if not 0 <= retries <= MAX_APPEND_RETRIES:
            raise InvalidArgument(f"retries must be in 0..={MAX_APPEND_RETRIES}, got {retries}")
        self._connection = connection
        self.retries = retries
        self.pending = pending
        self._schema_changed = schema_changed

    async def append(
        self, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], operation_id: str
    ) -> int:
        """Record the append durably (with a checkpoint directory), send it, forget it."""
        if self.pending is not None:
            await asyncio.to_thread(self.pending.write, operation_id, table, schema, batches)
            maybe_crash("after_pending_write")
        return await self._finish(table, schema, batches, operation_id)

    async def resume(self, operation_id: str) -> int:
        """Replay one pending append with its own operation id."""
        parse_operation_id(operation_id)
        if self.pending is None:
            raise FailedPrecondition("pending appends need an upload checkpoint directory")
        recovered = await asyncio.to_thread(self.pending.load, operation_id)
        return await self._finish(
            recovered.table, recovered.schema, recovered.batches, operation_id
        )

    async def pending_ids(self) -> list[str]:
        if self.pending is None:
            return []
        return await asyncio.to_thread(self.pending.ids)

    async def _finish(
        self, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], operation_id: str
    ) -> int:
        pending = self.pending
        try:
            version = await self._send(table, schema, batches, operation_id)
        except LakeError as error:
            if pending is not None and is_conclusive(error):
                pending.remove(operation_id)
            elif pending is not None:
                log.warning(
                    "append outcome unknown; resume it with resume_pending_append",
                    operation_id=operation_id,
                    error=type(error).__name__,
                )
            error.operation_id = operation_id  # type: ignore[attr-defined]
            raise
        maybe_crash("after_append_commit")
        if pending is not None:
            pending.remove(operation_id)
        return version

    async def _send(
        self, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], op_id: str
    ) -> int:
        command = protocol.AppendCommand(table=table, operation_id=op_id)
        descriptor = flight.FlightDescriptor.for_command(protocol.encode(command))
        attempt = 0
        while True:
            try:
                result = await self._connection.append(descriptor, schema, batches)
                return result.version
            except LakeError as error:
                if isinstance(error, InvalidArgument):
                    self._schema_changed(table)  # the cached schema may be stale
                    raise
                if not error.retryable or attempt >= self.retries:
                    raise
            await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
            attempt += 1
