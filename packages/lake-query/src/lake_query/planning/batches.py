"""Result batches sized for Flight: 1-4 MB each.

Lance scans in 8192-row batches (a few hundred KB for narrow tables), and
per-message overhead dominates at that size; 16 MB messages are slow and
exceed ADBC's default 16 MiB limit. Batches are therefore merged up to
:data:`TARGET_BATCH_BYTES` and split above :data:`MAX_BATCH_BYTES`. A batch
of :data:`MIN_BATCH_BYTES` or more is sent as it is: merging copies every
value, and on a full scan that copy cost more than the extra messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import Executor
from typing import Generic, TypeVar

import pyarrow as pa

from lake_core.telemetry import series

__all__ = [
    "MAX_BATCH_BYTES",
    "MIN_BATCH_BYTES",
    "PREFETCH_DEPTH",
    "TARGET_BATCH_BYTES",
    "coalesce_batches",
    "conform_batch",
    "counted_rows",
    "prefetch",
]

T = TypeVar("T")

TARGET_BATCH_BYTES = 2 * 1024 * 1024
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: A batch at least this large already makes a good Flight message on its own.
MIN_BATCH_BYTES = 1024 * 1024
#: Messages produced ahead of the network: bounds a stream's buffer to ~16 MB.
PREFETCH_DEPTH = 4


def counted_rows(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` unchanged, counting their rows as streamed query results."""
    for batch in batches:
        series.STREAMED_ROWS.inc(batch.num_rows)
        yield batch


def _size(batch: pa.RecordBatch) -> int:
    # nbytes counts only the referenced ranges of sliced buffers.
    return int(batch.nbytes)


def _split(batch: pa.RecordBatch, target: int) -> Iterator[pa.RecordBatch]:
    size = _size(batch)
    if batch.num_rows <= 1 or size <= target:
        yield batch
        return
    rows = max(1, batch.num_rows * target // size)
    for offset in range(0, batch.num_rows, rows):
        yield batch.slice(offset, rows)


def _merge(pending: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    if len(pending) == 1:
        return pending[0]
    return pa.Table.from_batches(pending, schema=schema).combine_chunks().to_batches()[0]


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` labelled with exactly ``schema`` (the one the client was promised).

    DataFusion's batches can differ from its planned schema in metadata or
    nullability flags only; the columns themselves must already match.
    """
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    if not batch.num_columns:
        # from_arrays of no arrays makes a batch of no rows: a zero-column result
        # (SELECT FROM t) lost every row, and merging such batches failed.
        return batch.replace_schema_metadata(schema.metadata)
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def coalesce_batches(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    *,
    target_bytes: int = TARGET_BATCH_BYTES,
    max_bytes: int = MAX_BATCH_BYTES,
    min_bytes: int = MIN_BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Re-chunk ``batches`` into non-empty batches of about ``target_bytes``.

    Every yielded batch is at most ``max_bytes`` unless one row alone is larger.
    Batches of ``min_bytes`` or more pass unchanged (no copy) unless a smaller
    one waits to be merged.
    """
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    for raw in batches:
        if raw.num_rows == 0:
            continue
        batch = conform_batch(raw, schema)
        size = _size(batch)
        if size > max_bytes:
            if pending:
                yield _merge(pending, schema)
                pending, pending_bytes = [], 0
            yield from _split(batch, target_bytes)
            continue
        if size >= min_bytes and (not pending or pending_bytes >= min_bytes):
            if pending:
                yield _merge(pending, schema)
                pending, pending_bytes = [], 0
            yield batch
            continue
        if pending and pending_bytes + size > max_bytes:
            yield _merge(pending, schema)
            pending, pending_bytes = [], 0
        pending.append(batch)
        pending_bytes += size
        if pending_bytes >= target_bytes:
            yield _merge(pending, schema)
            pending, pending_bytes = [], 0
    if pending:
        yield _merge(pending, schema)


class _End:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Handoff(Generic[T]):
    """Bounded producer-thread -> event-loop handoff.

    The producer only waits when ``depth`` items are already waiting; it
    never waits for the event loop itself, which is busy writing to sockets
    during a stream. The loop is woken only when its consumer is waiting.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, depth: int) -> None:
        self._loop = loop
        self._items: deque[T | _End] = deque()
        self._slots = threading.Semaphore(depth)
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self.stopped = threading.Event()

    def put(self, item: T | _End) -> bool:
        """Producer side: False once the consumer has gone."""
        while not self._slots.acquire(timeout=1.0):
            if self.stopped.is_set() or self._loop.is_closed():
                return False
        if self.stopped.is_set():
            return False
        with self._lock:
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            try:
                self._loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the loop closed under us
                return False
        return True

    async def get(self) -> T | _End:
        """Consumer side (event loop)."""
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    break
                waiter = self._waiter = self._loop.create_future()
            await waiter
        self._slots.release()
        return item

    def stop(self) -> None:
        self.stopped.set()
        with self._lock:
            self._items.clear()
        self._slots.release()  # a producer waiting for room sees ``stopped``


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def prefetch(
    items: Iterator[T], executor: Executor, depth: int = PREFETCH_DEPTH
) -> AsyncIterator[T]:
    """Iterate a blocking iterator on ``executor``, up to ``depth`` items ahead.

    Scanning and encoding the next message overlaps with sending this one.
    When the consumer stops early (closing this generator), the producer
    stops after its current item and closes ``items`` on its own thread, so
    a ``finally`` there (a query's memory reservation) runs at once, not
    whenever the collector finds the suspended generator.
    """
    loop = asyncio.get_running_loop()
    handoff: _Handoff[T] = _Handoff(loop, depth)

    def produce() -> None:
        try:
            for item in items:
                if handoff.stopped.is_set() or not handoff.put(item):
                    return
            handoff.put(_End())
        except BaseException as exc:  # handed to the consumer, raised there
            if not handoff.stopped.is_set():
                handoff.put(_End(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):  # an error of close() has no consumer
                    close()

    producer = loop.run_in_executor(executor, produce)
    try:
        while True:
            item = await handoff.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        handoff.stop()
        del producer  # it ends by itself after its current item
