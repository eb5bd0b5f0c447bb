"""Chunk sources over an open local file, for :class:`~lake_objects.reader.ObjectReader`.

:class:`FileChunks` reads a byte range, one chunk per worker-thread hop.
:class:`HashedFileChunks` reads a whole object and hashes it, reading the
next chunk while the current one is hashed: both ``file.read`` and
``hashlib`` (on more than 2 KiB) release the GIL, so a chunk costs about the
slower of the two instead of their sum. It reads at most one chunk ahead of
the one handed out, and hashes strictly in order.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import BinaryIO, TypeVar

__all__ = ["FileChunks", "HashedFileChunks"]

_T = TypeVar("_T")


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
    """A whole open file in chunks, SHA-256 over them; chunk N+1 is read while N is hashed.

    :meth:`sha256_hexdigest` is final once iteration stopped: the last
    chunk's hash is awaited before end of file is reported.
    """

    def __init__(self, file: BinaryIO, chunk_size: int) -> None:
        self._file = file
        self._chunk_size = chunk_size
        self._hasher = hashlib.sha256()
        #: The next chunk's read, running on a worker thread.
        self._ahead: asyncio.Future[bytes] | None = None
        #: The hash of the chunk last handed out, running on a worker thread.
        self._hashing: asyncio.Future[None] | None = None
        self._eof = False
        self._closed = False

    def __aiter__(self) -> HashedFileChunks:
        return self

    def _read(self) -> bytes:
        # A read still queued when the reader closed must not touch the (closing) file.
        if self._closed:
            return b""
        return self._file.read(self._chunk_size)

    def _submit(self, work: Callable[..., _T], *args: object) -> asyncio.Future[_T]:
        return asyncio.get_running_loop().run_in_executor(None, work, *args)

    async def __anext__(self) -> bytes:
        if self._closed:
            # Never a clean end: the bytes not read yet were not proved.
            raise ValueError("read of a closed object stream")
        if self._eof:
            raise StopAsyncIteration
        if self._ahead is None:
            self._ahead = self._submit(self._read)
        # Shielded: a cancelled consumer must not orphan a running read, which
        # aclose waits for before it closes the file.
        data = await asyncio.shield(self._ahead)
        self._ahead = None
        if self._hashing is not None:  # the previous chunk's, run alongside this read
            await asyncio.shield(self._hashing)
            self._hashing = None
        if not data:
            self._eof = True
            raise StopAsyncIteration
        self._hashing = self._submit(self._hasher.update, data)
        self._ahead = self._submit(self._read)
        return data

    def sha256_hexdigest(self) -> str:
        if not self._eof:
            raise RuntimeError("the digest is final only at end of file")
        return self._hasher.hexdigest()

    async def aclose(self) -> None:
        """Stop: a queued read is skipped, a running one waited for, then the file closed."""
        if self._closed:
            return
        self._closed = True
        pending = [f for f in (self._ahead, self._hashing) if f is not None]
        self._ahead = self._hashing = None
        running = [f for f in pending if not f.done()]
        if running:
            try:
                await asyncio.wait(running)
            except BaseException:
                # aclose itself was cancelled: close once the threads let go of the file.
                waiting = asyncio.gather(*running, return_exceptions=True)
                waiting.add_done_callback(lambda _: self._file.close())
                raise
        for future in pending:
            if not future.cancelled():
                future.exception()  # retrieved: the stream already ended another way
        self._file.close()
