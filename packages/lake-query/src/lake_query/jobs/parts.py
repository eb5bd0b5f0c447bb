"""Encoding a result into immutable Arrow IPC parts through a bounded channel.

The encoder runs on a worker thread next to the query: it writes each batch
into an IPC stream whose sink cuts fixed 64 KiB chunks into a four-slot
channel; the event loop drains the channel into the result store. A part
is closed before a batch would take it past the part ceiling (a batch that
alone would is sliced), and an encoded part that still crosses it, or a
result past the job's byte ceiling, fails the job before anything is
published. Cancellation and the deadline reach the encoder through one
event checked between batches.
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass

import pyarrow as pa

from lake_core.errors import QueryCancelled, ResultTooLarge
from lake_query.jobs.model import ManifestPart
from lake_query.jobs.results import CHUNK_BYTES, ResultStore

__all__ = ["CHANNEL_SLOTS", "write_parts"]

#: Chunks in flight between the encoder thread and the store writer.
CHANNEL_SLOTS = 4
# Slack for the end-of-stream marker and a batch's metadata beyond its estimate.
_TAIL_BYTES = 1024


@dataclass
class _PartEnd:
    rows: int
    sha256: str


@dataclass
class _Failed:
    error: BaseException


_DONE = object()


class _ChunkSink:
    """The IPC writer's file: cuts its output into fixed-size chunks on the channel."""

    def __init__(self, put: Callable[[object], None]) -> None:
        self._put = put
        # Hashed on the encoder thread, off the event loop.
        self.digest = hashlib.sha256()
        self._pending = bytearray()
        self.written = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        # Cut with a view: no front-deletes of a growing buffer (batches are megabytes).
        view = memoryview(data).cast("B")
        size = len(view)
        self.written += size
        if self._pending:
            need = CHUNK_BYTES - len(self._pending)
            self._pending += view[:need]
            view = view[need:]
            if len(self._pending) < CHUNK_BYTES:
                return size
            self._emit(bytes(self._pending))
            self._pending.clear()
        while len(view) >= CHUNK_BYTES:
            self._emit(bytes(view[:CHUNK_BYTES]))
            view = view[CHUNK_BYTES:]
        self._pending += view
        return size

    def _emit(self, chunk: bytes) -> None:
        self.digest.update(chunk)
        self._put(chunk)

    def flush(self) -> None:
        pass

    def drain(self) -> None:
        if self._pending:
            self._emit(bytes(self._pending))
            self._pending.clear()

    def close(self) -> None:
        self.closed = True


def _slices(batch: pa.RecordBatch, limit: int) -> Iterator[pa.RecordBatch]:
    if batch.num_rows <= 1 or pa.ipc.get_record_batch_size(batch) <= limit:
        yield batch
        return
    half = batch.num_rows // 2
    yield from _slices(batch.slice(0, half), limit)
    yield from _slices(batch.slice(half), limit)


def _encode(
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
    put: Callable[[object], None],
    stop: threading.Event,
    part_bytes: int,
    max_result_bytes: int,
) -> None:
    """Encoder thread: batches -> chunks, part ends and one final marker on the channel."""
    total = 0
    # Each part repeats the schema message: what is left of the ceiling holds batches.
    limit = part_bytes - len(schema.serialize()) - _TAIL_BYTES
    if limit <= 0:
        raise ResultTooLarge("the result schema alone fills an async result part")
    sink: _ChunkSink | None = None
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    rows = 0

    def close_part() -> None:
        nonlocal sink, writer, total, rows
        assert sink is not None
        assert writer is not None
        writer.close()
        if sink.written > part_bytes:
            raise ResultTooLarge("an async result part crossed the part ceiling")
        total += sink.written
        if total > max_result_bytes:
            raise ResultTooLarge("the async result is larger than its byte ceiling")
        sink.drain()
        put(_PartEnd(rows, sink.digest.hexdigest()))
        sink, writer, rows = None, None, 0

    for batch in batches:
        for piece in _slices(batch, limit):
            if stop.is_set():
                raise QueryCancelled("the async query was cancelled")
            size = pa.ipc.get_record_batch_size(piece)
            if sink is not None and sink.written + size > part_bytes - _TAIL_BYTES:
                close_part()
            if total + (sink.written if sink else 0) + size > max_result_bytes:
                raise ResultTooLarge("the async result is larger than its byte ceiling")
            if sink is None:
                sink = _ChunkSink(put)
                writer = pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema)
            assert writer is not None
            writer.write_batch(piece)
            rows += piece.num_rows
    if sink is None:  # an empty result is one part holding only the schema
        sink = _ChunkSink(put)
        writer = pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema)
    close_part()


async def _part_chunks(
    item: object,
    next_item: Callable[[], Awaitable[object]],
    ended: list[_PartEnd],
) -> AsyncIterator[bytes]:
    """One part's chunks from the channel, up to its end marker."""
    while True:
        if isinstance(item, _Failed):
            raise item.error
        if isinstance(item, _PartEnd):
            ended.append(item)
            return
        assert isinstance(item, bytes)
        yield item
        item = await next_item()


async def write_parts(
    schema: pa.Schema,
    produce: Callable[[], Iterator[pa.RecordBatch]],
    store: ResultStore,
    prefix: str,
    executor: Executor,
    stop: threading.Event,
    *,
    part_bytes: int,
    max_result_bytes: int,
    after_part: Callable[[], None] = lambda: None,
) -> list[ManifestPart]:
    """Run the query and store its parts under ``prefix``; the manifest is the caller's."""
    items: queue.Queue[object] = queue.Queue(maxsize=CHANNEL_SLOTS)

    def put(item: object) -> None:
        while True:
            if stop.is_set():
                raise QueryCancelled("the async query was cancelled")
            try:
                items.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def final(item: object) -> None:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def run() -> None:
        try:
            _encode(schema, produce(), put, stop, part_bytes, max_result_bytes)
            final(_DONE)
        except BaseException as exc:
            final(_Failed(exc))

    loop = asyncio.get_running_loop()
    encoder = loop.run_in_executor(executor, run)

    async def next_item() -> object:
        while True:
            try:
                return items.get_nowait()
            except queue.Empty:
                pass
            try:
                return await asyncio.to_thread(items.get, True, 0.5)
            except queue.Empty:
                if encoder.done() and items.empty():
                    return _Failed(QueryCancelled("the async query was cancelled"))

    parts: list[ManifestPart] = []
    try:
        while True:
            first = await next_item()
            if first is _DONE:
                break
            if isinstance(first, _Failed):
                raise first.error
            ended: list[_PartEnd] = []
            chunks = _part_chunks(first, next_item, ended)
            name = f"part-{len(parts):05d}.arrows"
            size = await store.write_object(f"{prefix}/{name}", chunks)
            parts.append(
                ManifestPart(name=name, bytes=size, rows=ended[0].rows, sha256=ended[0].sha256)
            )
            after_part()
    finally:
        stop.set()
        await asyncio.wait([encoder])
    return parts
