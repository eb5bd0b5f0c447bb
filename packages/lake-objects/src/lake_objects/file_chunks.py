"""Chunk sources over an open local file, for :class:`~lake_objects.reader.ObjectReader`.

:class:`FileChunks` reads a byte range, one chunk per worker-thread hop.
:class:`HashedFileChunks` reads a whole object and hashes it on a thread of
its own, one chunk ahead of the consumer (the consumer's work on chunk N
overlaps the read and hash of N+1), hashing strictly in order.
"""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

__all__ = ["FileChunks", "HashedFileChunks"]


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
