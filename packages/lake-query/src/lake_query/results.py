"""Result batches sized for Flight: 1-4 MB each.

Lance scans in 8192-row batches (a few hundred KB for narrow tables), and
per-message overhead dominates at that size; 16 MB messages are slow and
exceed ADBC's default 16 MiB limit. Batches are therefore merged up to
:data:`TARGET_BATCH_BYTES` and split above :data:`MAX_BATCH_BYTES`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import Executor
from typing import TypeVar

import pyarrow as pa

__all__ = [
    "MAX_BATCH_BYTES",
    "PREFETCH_DEPTH",
    "TARGET_BATCH_BYTES",
    "coalesce_batches",
    "conform_batch",
    "prefetch",
]

T = TypeVar("T")

TARGET_BATCH_BYTES = 2 * 1024 * 1024
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: Messages produced ahead of the network: bounds a stream's buffer to ~16 MB.
PREFETCH_DEPTH = 4


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
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def coalesce_batches(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    *,
    target_bytes: int = TARGET_BATCH_BYTES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> Iterator[pa.RecordBatch]:
    """Re-chunk ``batches`` into non-empty batches of about ``target_bytes``.

    Every yielded batch is at most ``max_bytes`` unless one row alone is larger.
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


async def prefetch(
    items: Iterator[T], executor: Executor, depth: int = PREFETCH_DEPTH
) -> AsyncIterator[T]:
    """Iterate a blocking iterator on ``executor``, up to ``depth`` items ahead.

    Scanning and encoding the next message overlaps with sending this one.
    When the consumer stops early, the producer stops after its current item.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[T | _End] = asyncio.Queue(maxsize=depth)
    stopped = threading.Event()

    def put(item: T | _End) -> bool:
        future = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
        while True:
            try:
                future.result(timeout=1.0)
                return True
            except concurrent.futures.TimeoutError:
                # A slow reader just waits; a gone one (or loop) ends the producer.
                if stopped.is_set() or loop.is_closed():
                    future.cancel()
                    return False

    def produce() -> None:
        try:
            for item in items:
                if stopped.is_set() or not put(item):
                    return
            put(_End())
        except BaseException as exc:  # handed to the consumer, raised there
            if not stopped.is_set():
                put(_End(exc))

    producer = loop.run_in_executor(executor, produce)
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stopped.set()
        while not queue.empty():  # unblock a producer waiting for room
            queue.get_nowait()
        del producer  # it ends by itself after its current item
