"""Encoding a result into immutable Arrow IPC parts through bounded channels.

Three threads of the worker pool form a pipeline, so execution and storage
overlap instead of following each other. The query executes on its own
thread into a queue bounded by bytes (:data:`AHEAD_BYTES`, at least one
batch): it computes the next batches while earlier ones are encoded and
stored. The encoder takes them from there: it serializes each
batch as one IPC message and cuts the part's bytes into fixed 64 KiB chunks
(views of the serialized buffer, no per-chunk copy) on a four-slot channel.
Each serialized batch goes through the part's MAC whole, on the encoder's
thread (:mod:`lake_query.jobs.tags`; ~11 GB/s), while the store drains the
channel and writes on its own thread, so encoding and writing overlap;
while one part is synced and renamed (or uploaded) the next one already
streams. A part is closed before a batch would take it past the part
ceiling (a batch that alone would is sliced), and an encoded part that still crosses it, or a
result past the job's byte ceiling, fails the job before anything is
published. Cancellation and the deadline reach all three threads through
one event checked between batches and whenever a side waits on a bounded
queue (a running batch is interrupted by the query stream itself, see
:mod:`lake_query.planning.abortable`); an error on any side stops the
other two, and :func:`write_parts` returns only once all three are done.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lake_core.errors import QueryCancelled, ResultTooLarge
from lake_core.flight.encoding import ChunkSink, has_dictionary
from lake_query.jobs.model import ManifestPart
from lake_query.jobs.results import CHUNK_BYTES, ResultStore
from lake_query.jobs.tags import PartTag, PartTagger

__all__ = ["AHEAD_BYTES", "CHANNEL_SLOTS", "write_parts"]

#: Chunks in flight between the encoder thread and the store writer.
CHANNEL_SLOTS = 4
#: Executed batches (their Arrow buffers) the query may hold ahead of the encoder, per job.
AHEAD_BYTES = 16 * 1024 * 1024
# Slack for the end-of-stream marker and a batch's metadata beyond its estimate.
_TAIL_BYTES = 1024
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# How often a blocked side of the channel looks at the stop event.
_WAIT_S = 0.2


@dataclass
class _PartEnd:
    rows: int
    tag: PartTag


@dataclass
class _Failed:
    error: BaseException


_DONE = object()


class _Channel:
    """The bounded channel: at most CHANNEL_SLOTS items; both ends give up once the job stops.

    Each side sleeps only at the boundary: the encoder when all four slots are
    full, and it is woken once they have all been taken; the writer when the
    channel is empty, woken by the next item. Waking the encoder per taken
    chunk cost about four thread switches per 64 KiB chunk (7,700 per 128 MB
    result, measured; about 3,500 with this channel).
    """

    def __init__(self, stop: threading.Event) -> None:
        self._items: collections.deque[object] = collections.deque()
        # Items put and not yet taken by the writer (those in ``_items`` included).
        self._outstanding = 0
        self._ready = threading.Condition()
        self._stop = stop

    def _offer(self, item: object, *, final: bool) -> None:
        with self._ready:
            while True:
                if self._stop.is_set():
                    if final:
                        return  # nobody is listening any more
                    raise QueryCancelled("the async query was cancelled")
                if self._outstanding < CHANNEL_SLOTS:
                    break
                self._ready.wait(_WAIT_S)
            self._items.append(item)
            self._outstanding += 1
            if self._outstanding == 1:
                self._ready.notify_all()  # the writer may be waiting for this one

    def put(self, item: object) -> None:
        self._offer(item, final=False)

    def final(self, item: object) -> None:
        """The encoder's last word; dropped if nobody is listening any more."""
        self._offer(item, final=True)

    def get(self) -> object:
        with self._ready:
            while not self._items:
                if self._stop.is_set():
                    return _Failed(QueryCancelled("the async query was cancelled"))
                self._ready.wait(_WAIT_S)
            item = self._items.popleft()
            self._outstanding -= 1
            if self._outstanding == 0:
                self._ready.notify_all()  # all slots free: the encoder may be waiting
            return item


class _Ahead:
    """The execution side: the query's batches, run ahead of the encoder within a byte bound.

    :meth:`run` iterates the query on its own thread (a query stream is
    iterated, and closed, on one thread) and waits while the queued
    batches hold :data:`AHEAD_BYTES` or more; a batch larger than that
    alone still passes, alone. Iterating the object (the encoder's thread)
    takes them in order and raises the query's error where the query
    raised it. Either side gives up once the job stops.
    """

    def __init__(self, stop: threading.Event, limit: int) -> None:
        self._items: collections.deque[tuple[object, int]] = collections.deque()
        self._bytes = 0
        self._limit = limit
        self._ready = threading.Condition()
        self._stop = stop

    def _offer(self, item: object, size: int, *, final: bool = False) -> None:
        with self._ready:
            while True:
                if self._stop.is_set():
                    if final:
                        return  # nobody is listening any more
                    raise QueryCancelled("the async query was cancelled")
                if not self._items or self._bytes + size <= self._limit:
                    break
                self._ready.wait(_WAIT_S)
            self._items.append((item, size))
            self._bytes += size
            self._ready.notify_all()

    def run(self, produce: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        """Executing thread: the whole query, into the queue; then its end or its error."""
        try:
            batches = produce()
            try:
                for batch in batches:
                    self._offer(batch, batch.get_total_buffer_size())
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()  # the stream ends on the thread that iterated it
            self._offer(_DONE, 0, final=True)
        except BaseException as exc:
            self._offer(_Failed(exc), 0, final=True)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            with self._ready:
                while not self._items:
                    if self._stop.is_set():
                        raise QueryCancelled("the async query was cancelled")
                    self._ready.wait(_WAIT_S)
                item, size = self._items.popleft()
                self._bytes -= size
                self._ready.notify_all()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item  # type: ignore[misc]


class _Chunker:
    """Cuts one part's bytes into exactly CHUNK_BYTES pieces (the last may be shorter)."""

    def __init__(self, put: Callable[[object], None], tagger: PartTagger) -> None:
        self._put = put
        self._pending = bytearray()
        self.written = 0
        self.tagger = tagger

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        self.written += len(view)
        self.tagger.update(view)
        if self._pending:
            need = CHUNK_BYTES - len(self._pending)
            self._pending += view[:need]
            view = view[need:]
            if len(self._pending) < CHUNK_BYTES:
                return
            self._put(bytes(self._pending))
            self._pending.clear()
        while len(view) >= CHUNK_BYTES:
            # A view of the serialized batch: it stays alive while the chunk does.
            self._put(view[:CHUNK_BYTES])
            view = view[CHUNK_BYTES:]
        self._pending += view

    def drain(self) -> None:
        if self._pending:
            self._put(bytes(self._pending))
            self._pending.clear()


class _PartEncoder:
    """One part's IPC stream: schema, batches, end marker, onto the chunker."""

    def __init__(
        self,
        schema: pa.Schema,
        header: pa.Buffer,
        put: Callable[[object], None],
        tagger: PartTagger,
    ):
        self.chunker = _Chunker(put, tagger)
        self.rows = 0
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._buffers: ChunkSink | None = None
        if has_dictionary(schema):
            # Dictionary batches must precede the batches using them: pyarrow's writer.
            self._buffers = ChunkSink()
            self._writer = pa.ipc.new_stream(pa.PythonFile(self._buffers, mode="w"), schema)
        else:
            self.chunker.write(header)

    def add(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self.chunker.write(batch.serialize())
        else:
            assert self._buffers is not None
            self._writer.write_batch(batch)
            for data in self._buffers.take():
                self.chunker.write(data)
        self.rows += batch.num_rows

    def close(self) -> None:
        if self._writer is None:
            self.chunker.write(_END_OF_STREAM)
        else:
            assert self._buffers is not None
            self._writer.close()
            for data in self._buffers.take():
                self.chunker.write(data)


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
    tagger: Callable[[int], PartTagger],
) -> None:
    """Encoder thread: batches -> chunks and part ends on the channel."""
    total = 0
    header = schema.serialize()
    # Each part repeats the schema message: what is left of the ceiling holds batches.
    limit = part_bytes - header.size - _TAIL_BYTES
    if limit <= 0:
        raise ResultTooLarge("the result schema alone fills an async result part")
    part: _PartEncoder | None = None
    parts = 0

    def open_part() -> _PartEncoder:
        nonlocal parts
        parts += 1
        return _PartEncoder(schema, header, put, tagger(parts - 1))

    def close_part() -> None:
        nonlocal part, total
        assert part is not None
        part.close()
        if part.chunker.written > part_bytes:
            raise ResultTooLarge("an async result part crossed the part ceiling")
        total += part.chunker.written
        if total > max_result_bytes:
            raise ResultTooLarge("the async result is larger than its byte ceiling")
        part.chunker.drain()
        put(_PartEnd(part.rows, part.chunker.tagger.finish()))
        part = None

    for batch in batches:
        for piece in _slices(batch, limit):
            if stop.is_set():
                raise QueryCancelled("the async query was cancelled")
            size = pa.ipc.get_record_batch_size(piece)
            if part is not None and part.chunker.written + size > part_bytes - _TAIL_BYTES:
                close_part()
            if total + (part.chunker.written if part else 0) + size > max_result_bytes:
                raise ResultTooLarge("the async result is larger than its byte ceiling")
            if part is None:
                part = open_part()
            part.add(piece)
    if part is None:  # an empty result is one part holding only the schema
        part = open_part()
    close_part()


class _PartSource:
    """One part's chunks off the channel, as the store takes them (on its thread)."""

    def __init__(
        self,
        first: object,
        get: Callable[[], object],
        consumed: Callable[[], None],
        midway: Callable[[], None],
    ):
        self._first = first
        self._get = get
        self._consumed = consumed
        self._midway = midway
        self.end: _PartEnd | None = None

    def __iter__(self) -> Iterator[bytes]:
        item = self._first
        try:
            while True:
                if isinstance(item, _Failed):
                    raise item.error
                if isinstance(item, _PartEnd):
                    self.end = item
                    return
                yield item  # type: ignore[misc]
                if item is self._first:
                    self._midway()  # the part has begun in the store
                item = self._get()
        finally:
            # The channel is the next part's now (or the job is over).
            self._consumed()


def _set(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
    tagger: Callable[[int], PartTagger],
    after_part: Callable[[], None] = lambda: None,
    midway: Callable[[], None] = lambda: None,
) -> list[ManifestPart]:
    """Run the query and store its parts under ``prefix``; the manifest is the caller's.

    ``tagger(index)`` starts the MAC of the part at ``index`` (0, 1, ...): the
    position the manifest lists it at. ``executor`` needs four threads per
    job (the query, the encoder, the part streaming, the part syncing).
    ``after_part`` runs as each part is stored, ``midway`` on the store's
    thread once each part's first chunk is written (fault points).
    """
    channel = _Channel(stop)
    ahead = _Ahead(stop, AHEAD_BYTES)

    def run() -> None:
        try:
            _encode(schema, iter(ahead), channel.put, stop, part_bytes, max_result_bytes, tagger)
            channel.final(_DONE)
        except BaseException as exc:
            channel.final(_Failed(exc))

    loop = asyncio.get_running_loop()
    # The query on one thread, the encoder on another, the store on a third (per part).
    executing = loop.run_in_executor(executor, ahead.run, produce)
    encoder = loop.run_in_executor(executor, run)
    parts: list[ManifestPart] = []
    # At most two parts in the store at once: one finishing (sync, rename) while the next streams.
    finishing: tuple[str, _PartSource, asyncio.Task[int]] | None = None

    async def settle(name: str, source: _PartSource, task: asyncio.Task[int]) -> None:
        size = await task
        end = source.end
        assert end is not None  # the store read the part to its end marker
        parts.append(ManifestPart(name=name, bytes=size, rows=end.rows, tag=end.tag))
        after_part()

    tasks: list[asyncio.Task[int]] = []
    try:
        while True:
            # Waits on the pool's threads: a job computing its first batch for minutes
            # must not hold a thread of the loop's default executor meanwhile.
            first = await loop.run_in_executor(executor, channel.get)
            if first is _DONE:
                break
            if isinstance(first, _Failed):
                raise first.error
            name = f"part-{len(parts) + (finishing is not None):05d}.arrows"
            consumed: asyncio.Future[None] = loop.create_future()

            def done_reading(future: asyncio.Future[None] = consumed) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
                    loop.call_soon_threadsafe(_set, future)

            source = _PartSource(first, channel.get, done_reading, midway)
            task = loop.create_task(store.write_object(f"{prefix}/{name}", iter(source), executor))
            tasks.append(task)
            either: list[asyncio.Future[Any]] = [consumed, task]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if (task.done() and task.exception() is not None) or source.end is None:
                # The store stopped reading mid-part: its error, before any later
                # chunk of this part could start a part of its own.
                await task
                raise RuntimeError("an async result part ended before its last chunk")
            if finishing is not None:
                await settle(*finishing)
            finishing = (name, source, task)
        if finishing is not None:
            await settle(*finishing)
    finally:
        stop.set()
        await asyncio.wait([executing, encoder])
        pending = [t for t in tasks if not t.done()]
        if pending:
            await asyncio.wait(pending)  # each sees the stop and removes its temporary
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: an error after the first one is not news
    return parts
