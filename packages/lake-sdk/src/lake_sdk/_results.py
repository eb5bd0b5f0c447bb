"""Query results: a stream of Arrow record batches pinned to the versions seen at planning.

A result of several endpoints (a partitioned scan) is read one endpoint after
another, in the order Query listed them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pyarrow as pa
import pyarrow.flight as flight

from lake_sdk import _frames as frames
from lake_sdk._errors import Trailers, lake_error

__all__ = ["AsyncQueryResult", "StreamOpener"]

#: Opens the DoGet stream of one more endpoint.
StreamOpener = Callable[[], Awaitable[tuple[flight.FlightStreamReader, Trailers]]]


class AsyncQueryResult(frames.DataFrameResult):
    """A stream of record batches; iterate it (``async for``), or collect it with
    :meth:`to_table`,
    :meth:`to_pandas` or :meth:`to_polars`. ``schema`` is known before the first batch."""

    def __init__(
        self,
        reader: flight.FlightStreamReader | None,
        schema: pa.Schema,
        trailers: Trailers,
        rest: Sequence[StreamOpener] = (),
    ) -> None:
        # None: no endpoint at all (an empty shard of a scan).
        self._reader = reader
        self._trailers = trailers
        self._rest = list(rest)
        self.schema = schema

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.schema)} columns)"

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[pa.RecordBatch]:
        while True:
            batch = await self.next_batch()
            if batch is None:
                return
            yield batch

    async def next_batch(self) -> pa.RecordBatch | None:
        """The next batch, or None at the end of the stream."""
        while True:
            try:
                batch = await asyncio.to_thread(self._next_batch)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, self._trailers) from None
            if batch is not None or not self._rest:
                return batch
            self._reader, self._trailers = await self._rest.pop(0)()

    def _next_batch(self) -> pa.RecordBatch | None:
        # StopIteration cannot cross a thread future, so end-of-stream becomes None.
        if self._reader is None:
            return None
        try:
            return self._reader.read_chunk().data
        except StopIteration:
            return None

    async def to_table(self) -> pa.Table:
        batches = [batch async for batch in self]
        return pa.Table.from_batches(batches, schema=self.schema)

    def cancel(self) -> None:
        """Stop the stream early (the server stops sending); later endpoints are not read."""
        self._rest.clear()
        if self._reader is not None:
            self._reader.cancel()
