"""A seekable, read-only binary file over exact range reads of one FILE object.

:class:`ObjectFile` is an :class:`io.BufferedIOBase` that decoders and archive
readers (PyAV, zipfile, tarfile) can use as if the object were local. Reads
are served from a bounded :class:`~lake_sdk._block_cache.BlockCache`; misses
become exact range reads (one S3 Range GET, one local ``pread``-sized read,
or one GET through a Query-issued capability).

The sync/async bridge: the file's methods are blocking and run in the
caller's thread (for PyAV, a thread FFmpeg calls back from). Only the range
fetch itself runs on the client's event loop, handed over with
:func:`asyncio.run_coroutine_threadsafe`. A :class:`~lake_sdk.Client` runs
on the SDK's shared background loop thread; for an :class:`~lake_sdk.AsyncClient` it is the loop
that opened the file, so use the file from another thread
(``await asyncio.to_thread(av.open, file)``): calling it on the loop itself
would wait on itself, and raises ``FailedPrecondition`` instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from lake_core.errors import FailedPrecondition
from lake_core.models import DataLocation
from lake_objects.errors import PrematureEof
from lake_sdk._block_cache import BlockCache, CacheLimits

__all__ = ["ObjectFile", "RangeFetcher"]

#: How long closing waits for the loop to release a fetcher's connections.
_CLOSE_TIMEOUT_S = 10.0


class RangeFetcher(Protocol):
    """Exact half-open ranges of one object, fetched on the client's loop."""

    def fetch(self, start: int, end: int) -> Coroutine[Any, Any, bytes]: ...

    def close(self) -> Coroutine[Any, Any, None]: ...


class ObjectFile(io.BufferedIOBase):
    """A read-only, seekable view of one object; see :meth:`lake_sdk.AsyncClient.open_file`.

    ``bytes_fetched`` counts bytes read from storage; ``verified`` turns true
    once the whole object has been read in order from byte 0 (however it was
    sought about meanwhile) and matched its size and SHA-256. A mismatch raises
    :class:`~lake_sdk.HashMismatch` from that read and from every read after it.
    """

    def __init__(
        self,
        location: DataLocation,
        fetcher: RangeFetcher,
        loop: asyncio.AbstractEventLoop,
        limits: CacheLimits,
        *,
        client_closed: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__()
        self.location = location
        self._fetcher = fetcher
        self._loop = loop
        # The blocking clients share one loop that outlives them: ask the client itself.
        self._client_closed = client_closed
        self._cache = BlockCache(location, limits)
        self._position = 0
        self._exact_bytes = 0
        self._exact_fetches = 0
        self._lock = threading.RLock()  # decoders may call from more than one thread

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"at {self._position}"
        return f"ObjectFile({self.location.uri!r}, {self.location.size_bytes} bytes, {state})"

    # -- what it has done ---------------------------------------------------

    @property
    def size(self) -> int:
        return self.location.size_bytes

    @property
    def bytes_fetched(self) -> int:
        """Bytes fetched from storage so far (read-ahead, re-fetches and :meth:`pread` included)."""
        return self._cache.bytes_fetched + self._exact_bytes

    @property
    def fetches(self) -> int:
        """Range reads issued so far."""
        return self._cache.fetches + self._exact_fetches

    @property
    def cached_bytes(self) -> int:
        return self._cache.cached_bytes

    @property
    def peak_cached_bytes(self) -> int:
        """The most the block cache ever held (never above ``cache_bytes``)."""
        return self._cache.peak_bytes

    @property
    def limits(self) -> CacheLimits:
        return self._cache.limits

    @property
    def verified(self) -> bool:
        return self._cache.verified

    # -- io.BufferedIOBase -------------------------------------------------

    def readable(self) -> bool:
        self._check_open()
        return True

    def seekable(self) -> bool:
        self._check_open()
        return True

    def writable(self) -> bool:
        self._check_open()
        return False

    def tell(self) -> int:
        self._check_open()
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        self._check_open()
        # As io.BytesIO: an absolute position must not be negative; a relative one stops at 0.
        if whence == io.SEEK_SET:
            if offset < 0:
                raise ValueError(f"negative seek position {offset}")
            target = offset
        elif whence == io.SEEK_CUR:
            target = max(0, self._position + offset)
        elif whence == io.SEEK_END:
            target = max(0, self.size + offset)
        else:
            raise ValueError(f"invalid whence ({whence}, should be 0, 1 or 2)")
        with self._lock:
            self._position = target  # past EOF is allowed, as for any file; reads return b""
        return target

    def read(self, size: int | None = -1, /) -> bytes:
        self._check_open()
        with self._lock:
            left = max(0, self.size - self._position)
            want = left if size is None or size < 0 else min(size, left)
            out = bytearray(want)
            count = self._read_into(memoryview(out))
            del out[count:]
            return bytes(out)

    def read1(self, size: int = -1, /) -> bytes:
        return self.read(size)

    def readinto(self, buffer: object, /) -> int:
        self._check_open()
        view = memoryview(buffer).cast("B")  # type: ignore[arg-type]
        with self._lock:
            return self._read_into(view)

    def readinto1(self, buffer: object, /) -> int:
        return self.readinto(buffer)

    def peek(self, size: int = 0, /) -> bytes:
        """Bytes at the position without moving it (at least one, unless at EOF)."""
        self._check_open()
        with self._lock:
            if self._position >= self.size:
                return b""
            cached = self._cache.peek(self._position)
            if not cached:
                self._fill(self._position, 1)
                cached = self._cache.peek(self._position)
            return cached

    def pread(self, start: int, end: int) -> bytes:
        """Exactly bytes ``start..end`` in one range read, bypassing the block cache.

        For a reader that knows precisely what it needs (a file format's
        footer and index) and would waste most of a block. The position does
        not move; the bytes count in :attr:`bytes_fetched`.
        """
        self._check_open()
        if not 0 <= start < end <= self.size:
            raise ValueError(f"range {start}..{end} is not inside 0..{self.size}")
        data = self._run(self._fetcher.fetch, start, end)
        if len(data) != end - start:
            raise PrematureEof(
                f"range {start}..{end} of {self.location.uri!r} returned {len(data)} bytes",
                uri=self.location.uri,
            )
        with self._lock:
            self._exact_bytes += len(data)
            self._exact_fetches += 1
        return data

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._release()
        finally:
            self._cache.clear()
            super().close()

    def detach(self) -> io.RawIOBase:
        raise io.UnsupportedOperation("an ObjectFile has no raw stream to detach")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an ObjectFile is not an OS file")

    # -- the work ------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on a closed ObjectFile")

    def _read_into(self, out: memoryview) -> int:
        self._cache.check()
        offset = self._position
        end = min(self.size, offset + len(out))
        if offset >= end:
            self._cache.check()
            return 0
        self._cache.note_read(offset)
        written = 0
        while offset + written < end:
            here = offset + written
            step_end = self._fill(here, end - here)
            written += self._cache.copy(here, step_end, out[written:])
            self._cache.note_consumed(here, step_end - here)
            self._position = offset + written
        return written

    def _fill(self, offset: int, size: int) -> int:
        """Make ``offset..`` (one step of at most half the cache) resident; return its end."""
        step_end, fetches = self._cache.plan(offset, size)
        block = self._cache.limits.block_size
        touch = range(offset // block, (step_end - 1) // block + 1)
        for start, end in fetches:
            data = self._run(self._fetcher.fetch, start, end)
            if len(data) != end - start:
                raise PrematureEof(
                    f"range {start}..{end} of {self.location.uri!r} returned {len(data)} bytes",
                    uri=self.location.uri,
                )
            self._cache.store(start, data, touch)
        return step_end

    def _run(
        self, fetch: Callable[[int, int], Coroutine[Any, Any, bytes]], start: int, end: int
    ) -> bytes:
        self._check_thread()
        if self._loop.is_closed() or not self._loop.is_running() or self._client_closed():
            raise FailedPrecondition(
                f"the client that opened {self.location.uri!r} is closed: open the file again"
            )
        future = asyncio.run_coroutine_threadsafe(fetch(start, end), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt in the caller: stop the fetch too
            raise

    def _check_thread(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self._loop:
            raise FailedPrecondition(
                "an ObjectFile blocks: use it from another thread than the client's event loop "
                "(for example `await asyncio.to_thread(file.read, n)`)"
            )

    def _release(self) -> None:
        if self._loop.is_closed() or not self._loop.is_running():
            return  # the client closed first and took its connections with it
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._loop.create_task(self._fetcher.close())
            return
        future = asyncio.run_coroutine_threadsafe(self._fetcher.close(), self._loop)
        try:
            future.result(_CLOSE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
