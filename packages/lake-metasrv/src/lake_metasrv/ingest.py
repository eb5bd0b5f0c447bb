"""Bulk ingest: one stream of any length committed once, as ONE append and one version.

A Query replica forwards a Flight SQL ``CommandStatementIngest`` here as a
DoPut whose descriptor is an :class:`~lake_core.protocol.IngestCommand`.
The stream is checked and written as it arrives, with bounded memory:

    authorize (the caller did); the table exists; the stream's schema is the
      table's, or the same values in another layout (``arriving_schema``)
    each batch, on one writer thread: value checks, FILE cells well-formed
      and inside the tenant's managed-stage prefix (``check_rows``' rules),
      then into Lance fragments (``engine.prepare_stream``: Lance rolls files
      at its bounds, so no process ever holds the whole stream)
    LAKE_INGEST_MAX_ROWS / LAKE_INGEST_MAX_BYTES: refused as soon as passed
    the end marker (:data:`~lake_core.protocol.INGEST_END`) arrives: the
      fragments are queued as one append (``append_prepared``), committed by
      the commit coordinator like any other, under one operation id

Anything else (a refusal, a client or Query that goes away, a Metasrv that
dies) leaves only unreferenced fragment files: invisible orphans, never a
version.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import structlog

from lake_core import protocol
from lake_core.errors import (
    Aborted,
    InvalidAppend,
    InvalidArgument,
    PayloadTooLarge,
    TableNotFound,
)
from lake_core.flight.encoding import FlightDataDecoder, InvalidFlightData
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.schemas import arriving_schema
from lake_core.values import check_batches, check_not_null
from lake_metasrv.appends import CheckedRows, cast_arriving, conform, observed_append
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.engine.base import PreparedAppend
from lake_metasrv.registry.base import TableRecord
from lake_metasrv.sidecars.base import file_uris
from lake_objects.scope import TenantScope

__all__ = [
    "FEED_BATCHES",
    "Ingests",
    "ingest_command",
    "is_ingest",
]

log = structlog.get_logger("lake_metasrv.ingest")

T = TypeVar("T")

#: Decoded batches waiting for the writer thread at most (the memory bound per ingest).
FEED_BATCHES = 4


class _Feed:
    """A bounded hand-over of batches from the event loop to the writer's own thread.

    The loop side never blocks a thread: a full feed is awaited on an event
    the writer sets (thread-safely) each time it takes a batch or stops.
    """

    def __init__(self, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self._items: deque[pa.RecordBatch] = deque()
        self._capacity = capacity
        self._cond = threading.Condition()
        self._end: BaseException | bool = False  # True: finished; an error: aborted
        self._reader_gone = False
        self._loop = loop
        self._space = asyncio.Event()

    def _offer(self, batch: pa.RecordBatch) -> bool:
        """Add without waiting (dropped once the writer stopped); False when full."""
        with self._cond:
            if self._reader_gone:
                return True
            if len(self._items) >= self._capacity:
                return False
            self._items.append(batch)
            self._cond.notify_all()
            return True

    async def put(self, batch: pa.RecordBatch) -> None:
        while True:
            self._space.clear()  # before the offer: a take after it sets it again
            if self._offer(batch):
                return
            await self._space.wait()

    def _taken(self) -> None:
        self._loop.call_soon_threadsafe(self._space.set)

    def finish(self) -> None:
        with self._cond:
            self._end = True
            self._cond.notify_all()

    def abort(self, error: BaseException) -> None:
        with self._cond:
            self._items.clear()
            self._end = error
            self._cond.notify_all()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The writer thread's side: each batch, until finished (or the abort's error)."""
        try:
            while True:
                with self._cond:
                    while not self._items and self._end is False:
                        self._cond.wait()
                    if self._items:
                        batch = self._items.popleft()
                    elif isinstance(self._end, BaseException):
                        raise self._end
                    else:
                        return
                self._taken()
                yield batch
        finally:
            with self._cond:
                self._reader_gone = True
            self._taken()


def _on_own_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """``fn()`` on a thread of its own (an ingest's writer lives as long as its stream:
    it must not hold one of the loop's shared executor threads)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def run() -> None:
        try:
            value = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=run, name="lake-ingest-writer", daemon=True).start()
    return future


@dataclass
class _Checked:
    """What the writer thread learned while checking the stream."""

    adds: set[str] = field(default_factory=set)
    rows: int = 0
    error: BaseException | None = None


class Ingests:
    """Runs bulk ingests for one Metasrv over its commit coordinator."""

    def __init__(self, coordinator: CommitCoordinator) -> None:
        self.coordinator = coordinator
        #: LAKE_INGEST_MAX_ROWS and LAKE_INGEST_MAX_BYTES (lake_metasrv.config).
        self.max_rows = coordinator.config.ingest_max_rows
        self.max_bytes = coordinator.config.ingest_max_bytes

    async def ingest(
        self,
        command: protocol.IngestCommand,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
    ) -> protocol.IngestResult:
        """Check, write and commit one ingest stream; the caller authorized ``principal``."""
        coordinator = self.coordinator
        coordinator.gate.check()
        decoder = FlightDataDecoder(max_bytes=self.max_bytes, too_large=self._too_large)
        pending = self._feed(decoder, first)
        ended = first.app_metadata == protocol.INGEST_END
        while decoder.schema is None and not ended:
            message = await anext(messages, None)
            if message is None:
                raise Aborted("the ingest stream ended before its schema; nothing was committed")
            pending += self._feed(decoder, message)
            ended = message.app_metadata == protocol.INGEST_END
        if decoder.schema is None:
            raise InvalidAppend("an ingest stream needs an Arrow schema")
        record = await self._table(command.table)
        target = arriving_schema(record.schema, decoder.schema, command.table)
        scope = coordinator.stage.scope(principal.tenant_id)
        feed = _Feed(FEED_BATCHES, asyncio.get_running_loop())
        checked = _Checked()
        schema = decoder.schema if target is None else target
        writer = _on_own_thread(
            lambda: self._write(record, schema, target is not None, feed, checked, scope)
        )
        rows = 0
        try:
            for batch in pending:
                rows = await self._send(feed, batch, rows)
            while not ended:
                message = await anext(messages, None)
                if message is None:
                    raise Aborted(
                        f"the ingest into {command.table} ended without its end marker; "
                        "nothing was committed"
                    )
                for batch in self._feed(decoder, message):
                    rows = await self._send(feed, batch, rows)
                if writer.done():  # the writer refused a batch: refuse now, not at the end
                    await writer
                ended = message.app_metadata == protocol.INGEST_END
            feed.finish()
            prepared = await writer
        except BaseException as exc:
            feed.abort(Aborted("the ingest was abandoned"))
            # The writer stops at its next batch; its files stay unreferenced orphans.
            await asyncio.wait([writer])
            if checked.error is not None and isinstance(exc, Exception):
                raise checked.error from None
            raise
        if rows == 0:
            return protocol.IngestResult(
                table=command.table,
                operation_id=command.operation_id,
                version=record.version,
                rows=0,
            )
        append = protocol.AppendCommand(table=command.table, operation_id=command.operation_id)
        result = await observed_append(
            coordinator.append_prepared(
                append,
                record.schema,
                rows,
                CheckedRows(record.schema.empty_table(), sorted(checked.adds)),
                prepared,
                tenant_id=principal.tenant_id,
            )
        )
        log.info(
            "ingest committed",
            table=str(command.table),
            rows=rows,
            version=result.version,
            fragments=len(prepared.fragments),
        )
        return protocol.IngestResult(
            table=command.table,
            operation_id=command.operation_id,
            version=result.version,
            rows=rows,
            replayed=result.replayed,
        )

    def _too_large(self, message: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"an ingest carries at most {self.max_bytes} encoded bytes (LAKE_INGEST_MAX_BYTES; "
            f"{message}); nothing was committed"
        )

    def _feed(self, decoder: FlightDataDecoder, message: pb.FlightData) -> list[pa.RecordBatch]:
        try:
            return decoder.feed(message)
        except InvalidFlightData as exc:
            raise InvalidArgument(f"invalid ingest data: {exc}") from None

    async def _send(self, feed: _Feed, batch: pa.RecordBatch, rows: int) -> int:
        if batch.num_rows == 0:
            return rows
        rows += batch.num_rows
        if rows > self.max_rows:
            raise PayloadTooLarge(
                f"an ingest holds at most {self.max_rows} rows (LAKE_INGEST_MAX_ROWS); "
                "nothing was committed"
            )
        await feed.put(batch)
        return rows

    def _write(
        self,
        record: TableRecord,
        wire_schema: pa.Schema,
        cast: bool,
        feed: _Feed,
        checked: _Checked,
        scope: TenantScope,
    ) -> PreparedAppend:
        """The writer thread: check each batch (cast to ``wire_schema`` first if ``cast``),
        write it into fragments."""
        table_schema = record.schema

        def conformed() -> Iterator[pa.RecordBatch]:
            for arrived in feed.batches():
                try:
                    batch = cast_arriving(arrived, wire_schema, record.table) if cast else arrived
                    check_batches(record.table, table_schema, [batch], first_row=checked.rows)
                    check_not_null(record.table, table_schema, [batch], first_row=checked.rows)
                    data = conform([batch], wire_schema, table_schema)
                    for uri in file_uris(data, table_schema):
                        if uri not in checked.adds:
                            scope.check(uri)
                            checked.adds.add(uri)
                except Exception as exc:
                    checked.error = exc
                    raise
                checked.rows += batch.num_rows
                yield from data.to_batches()

        reader = pa.RecordBatchReader.from_batches(table_schema, conformed())
        engine = self.coordinator.engine
        try:
            return engine.prepare_stream(
                record.location, record.incarnation, record.engine_version, reader
            )
        except Exception:
            if checked.error is not None:
                raise checked.error from None
            raise

    async def _table(self, table: TableRef) -> TableRecord:
        record = await self.coordinator.registry.get_table(table)
        if record is None:
            raise TableNotFound(table)
        return record


def is_ingest(descriptor: pb.FlightDescriptor | None) -> bool:
    """Whether a DoPut descriptor carries an IngestCommand (else: an append)."""
    if descriptor is None or descriptor.type != pb.FlightDescriptor.CMD:
        return False
    try:
        body = json.loads(descriptor.cmd)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("type") == protocol.INGEST_COMMAND_TYPE


def ingest_command(descriptor: pb.FlightDescriptor | None) -> protocol.IngestCommand:
    if descriptor is None:
        raise InvalidArgument("an ingest's first message needs a CMD descriptor")
    return protocol.decode(protocol.IngestCommand, bytes(descriptor.cmd))
