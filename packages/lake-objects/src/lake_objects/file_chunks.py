"""Chunk sources over an open local file, for :class:`~lake_objects.reader.ObjectReader`.

:class:`FileChunks` reads a byte range, one chunk per worker-thread hop.
:class:`HashedFileChunks` reads a whole object and hashes it on a thread of
its own, one chunk ahead of the consumer (the consumer's work on chunk N
overlaps the read and hash of N+1), hashing strictly in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

__all__ = ["DRAIN_PIECE", "FileChunks", "HashedFileChunks", "write_all"]

#: Bytes per piece of :meth:`HashedFileChunks.drain_into` (at most; its chunk size if smaller):
#: big enough that hashlib runs at full speed without the GIL, small enough to stay in cache.
DRAIN_PIECE = 1024 * 1024
#: Pieces in flight per drain: one being read and hashed, the ones before it being written.
DRAIN_DEPTH = 3


class _Buffers:
    """Reused piece buffers (a fresh one costs a page fault per 4 KiB): at most ``keep`` kept."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        with self._lock:
            for n, buffer in enumerate(self._free):
                if len(buffer) == size:
                    return self._free.pop(n)
        return bytearray(size)

    def give(self, buffer: bytearray) -> None:
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(buffer)


#: Enough for a few drains at once (an export copies four files at a time).
_BUFFERS = _Buffers(keep=4 * DRAIN_DEPTH)


def write_all(destination: BinaryIO, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` (a raw file may take fewer at once)."""
    view = memoryview(data)
    while view:
        written = destination.write(view)
        if written is None or written >= len(view):
            return
        view = view[written:]


class FileChunks:
    """Up to ``remaining`` bytes of an open file, in chunks read on a worker thread."""

    def __init__(self, file: BinaryIO, remaining: int, chunk_size: int) -> None:
        self._file = file
        self._remaining = remaining
        self._chunk_size = chunk_size

    def __aiter__(self) -> FileChunks:
        return self

    def _read(self) -> bytes:
        size = min(self._chunk_size, self._remaining)
        if size == 0:
            return b""
        data = self._file.read(size)
        self._remaining -= len(data)
        return data

    async def __anext__(self) -> bytes:
        data = await asyncio.to_thread(self._read)
        if not data:
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        self._file.close()


class HashedFileChunks:
    """A whole open file in chunks, SHA-256 over them; chunk N+1 is read and hashed while N is used.

    Each chunk is read and then hashed by the same thread, one of the
    reader's own, one chunk ahead of the consumer: the same work in the same
    order as ``hashlib`` over the file, plus one hop per chunk. (Reading on
    one pool thread while another hashed the previous chunk measured 0.75 of
    that on some boots of the 2-core machine: the chunks then move between
    threads, their allocator arenas and caches; docs/performance-analysis.md.)
    :meth:`sha256_hexdigest` is final once iteration stopped.
    """

    def __init__(self, file: BinaryIO, chunk_size: int) -> None:
        self._file = file
        self._chunk_size = chunk_size
        self._hasher = hashlib.sha256()
        #: The reader's thread, started by the first read and stopped at the end.
        self._worker: ThreadPoolExecutor | None = None
        #: The next chunk's read and hash, running on that thread.
        self._ahead: asyncio.Future[bytes] | None = None
        self._eof = False
        self._closed = False

    def __aiter__(self) -> HashedFileChunks:
        return self

    def _step(self) -> bytes:
        # A step still queued when the reader closed must not touch the (closing) file.
        if self._closed:
            return b""
        data = self._file.read(self._chunk_size)
        if data:
            self._hasher.update(data)
        return data

    def _submit(self) -> asyncio.Future[bytes]:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="lake-verified-read")
        return asyncio.get_running_loop().run_in_executor(self._worker, self._step)

    async def __anext__(self) -> bytes:
        if self._closed:
            # Never a clean end: the bytes not read yet were not proved.
            raise ValueError("read of a closed object stream")
        if self._eof:
            raise StopAsyncIteration
        if self._ahead is None:
            self._ahead = self._submit()
        # Shielded: a cancelled consumer must not orphan a running read, which
        # aclose waits for before it closes the file.
        data = await asyncio.shield(self._ahead)
        self._ahead = None
        if not data:
            self._eof = True
            self._stop_worker()
            raise StopAsyncIteration
        self._ahead = self._submit()
        return data

    def drain_into(
        self, destination: BinaryIO, limit: int, stopped: Callable[[], bool] = lambda: False
    ) -> int | None:
        """Blocking: copy the file to ``destination``, hashing every byte written; bytes read.

        At most ``limit`` bytes are written; one more is read to tell whether the
        file is longer (then ``limit + 1`` is returned: the caller fails it).
        Pieces are read into reused buffers on this thread and hashed here in
        order, each written by a second thread meanwhile. Returns None, doing
        nothing, if chunks were already taken by iteration. ``stopped`` is
        asked between pieces (a cancelled copy ends there, with an error).
        """
        started = self._closed or self._eof or self._ahead is not None or self._worker is not None
        if started or not hasattr(self._file, "readinto"):
            return None
        piece = max(1, min(self._chunk_size, DRAIN_PIECE))
        buffers = [_BUFFERS.take(piece) for _ in range(DRAIN_DEPTH)]
        writes: list[Future[None] | None] = [None] * DRAIN_DEPTH
        writer = ThreadPoolExecutor(1, thread_name_prefix="lake-verified-write")
        total = 0
        try:
            n = 0
            while total < limit:
                if stopped():
                    raise InterruptedError("the copy was stopped")
                slot = n % DRAIN_DEPTH
                pending = writes[slot]
                if pending is not None:
                    pending.result()  # the buffer is free again (and its write succeeded)
                view = memoryview(buffers[slot])[: min(piece, limit - total)]
                got = self._file.readinto(view)
                if not got:
                    break
                view = view[:got]
                writes[slot] = writer.submit(write_all, destination, view)
                self._hasher.update(view)  # beside the write: both only read the buffer
                total += got
                n += 1
            if total == limit and self._file.read(1):
                total += 1  # longer than declared: nothing past ``limit`` was written
            for pending in writes:
                if pending is not None:
                    pending.result()
        finally:
            writer.shutdown(wait=True)  # no write outlives the call, whatever failed
            for buffer in buffers:
                _BUFFERS.give(buffer)
        self._eof = True
        return total

    def sha256_hexdigest(self) -> str:
        if not self._eof:
            raise RuntimeError("the digest is final only at end of file")
        return self._hasher.hexdigest()

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=False)
            self._worker = None

    def _close_file(self) -> None:
        self._file.close()
        self._stop_worker()

    async def aclose(self) -> None:
        """Stop: a queued read is skipped, a running one waited for, then the file closed."""
        if self._closed:
            return
        self._closed = True
        pending, self._ahead = self._ahead, None
        if pending is not None and not pending.done():
            try:
                await asyncio.wait([pending])
            except BaseException:
                # aclose itself was cancelled: close once the thread lets go of the file.
                pending.add_done_callback(lambda _: self._close_file())
                raise
        if pending is not None and not pending.cancelled():
            pending.exception()  # retrieved: the stream already ended another way
        self._close_file()
