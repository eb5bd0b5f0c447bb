"""Readers that never yield more than the DataLocation promises.

:class:`ObjectReader` wraps a raw chunk stream from local storage, S3 or an
HTTP capability. A whole-object reader counts bytes and hashes them as they
pass, and proves size and SHA-256 at EOF; a range reader proves it got
exactly ``end - start`` bytes. Both raise a typed
:class:`~lake_objects.errors.ObjectIntegrityError` and never hand out a byte
beyond the declared length. Memory stays at a chunk or two whatever the size
(a local whole-object read holds the next chunk read ahead).

``copy_to`` is a pipeline: each chunk is written on a worker thread while
the next is fetched and hashed, and a whole local object is copied in one
blocking call (read, hash and write overlapped on two threads:
:meth:`~lake_objects.file_chunks.HashedFileChunks.drain_into`). Either way
every byte written is hashed, and a path gets the bytes only once size and
SHA-256 matched.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from lake_core.models import DataLocation
from lake_objects.errors import HashMismatch, InvalidRange, ObjectOverlong, PrematureEof
from lake_objects.file_chunks import write_all

__all__ = ["CHUNK_SIZE", "ObjectReader", "check_range"]

#: Read size for object streams.
CHUNK_SIZE = 1024 * 1024
#: Chunks at least this big are hashed on a worker thread (hashlib releases the GIL).
_THREAD_HASH_BYTES = 256 * 1024

RawChunks = AsyncIterator[bytes]


def check_range(location: DataLocation, start: int, end: int) -> None:
    """Raise InvalidRange unless ``0 <= start < end <= size`` (half-open, non-empty)."""
    for value, what in ((start, "start"), (end, "end")):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidRange(f"range {what} must be an integer")
    if start < 0 or end < 0:
        raise InvalidRange(f"range {start}..{end} has a negative bound")
    if end < start:
        raise InvalidRange(f"range {start}..{end} is reversed")
    if end == start:
        raise InvalidRange(f"range {start}..{end} is empty")
    if end > location.size_bytes:
        raise InvalidRange(
            f"range {start}..{end} is outside the object's {location.size_bytes} bytes"
        )


class ObjectReader:
    """An async stream of an object's bytes (or of one range), checked as it goes.

    Iterate it for chunks, ``await read(n)``, or ``await copy_to(file)``. A
    whole-object reader raises at EOF unless size and SHA-256 match; a reader
    dropped early has proved nothing.
    """

    def __init__(
        self,
        location: DataLocation,
        chunks: RawChunks,
        *,
        start: int = 0,
        end: int | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
        hashed_chunks: bool = False,
    ) -> None:
        self.location = location
        self.start = start
        self.end = location.size_bytes if end is None else end
        self.whole = start == 0 and end is None
        self._chunks = chunks
        self._close = close
        self._hasher = hashlib.sha256() if self.whole and not hashed_chunks else None
        self._prehashed = hashed_chunks
        self._seen = 0
        self._buffer = b""
        self._eof = False
        self._closed = False
        self.verified = False

    def __repr__(self) -> str:
        return f"ObjectReader({self.location.uri!r}, {self.start}..{self.end})"

    @property
    def expected(self) -> int:
        return self.end - self.start

    @property
    def bytes_read(self) -> int:
        return self._seen

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        if self._buffer:
            data, self._buffer = self._buffer, b""
            yield data
        while True:
            chunk = await self._next_checked()
            if chunk is None:
                return
            yield chunk

    async def _next_checked(self) -> bytes | None:
        if self._eof:
            return None
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            chunk = None
        except BaseException:
            await self.aclose()
            raise
        if chunk is None:
            self._eof = True
            await self.aclose()
            self._finish()
            return None
        if not chunk:
            return b""
        if self._seen + len(chunk) > self.expected:
            await self.aclose()
            self._eof = True
            raise ObjectOverlong(
                f"{self._what} is longer than its declared {self.expected} bytes",
                uri=self.location.uri,
            )
        self._seen += len(chunk)
        if self._hasher is not None:
            if len(chunk) >= _THREAD_HASH_BYTES:
                await asyncio.to_thread(self._hasher.update, chunk)
            else:
                self._hasher.update(chunk)
        return chunk

    @property
    def _what(self) -> str:
        if self.whole:
            return f"object {self.location.uri!r}"
        return f"range {self.start}..{self.end} of {self.location.uri!r}"

    def _finish(self) -> None:
        if self._seen < self.expected:
            raise PrematureEof(
                f"{self._what} ended after {self._seen} of {self.expected} bytes",
                uri=self.location.uri,
            )
        if self._hasher is not None or self._prehashed:
            digest = self._digest()
            if digest != self.location.sha256:
                raise HashMismatch(
                    f"object {self.location.uri!r} has {self.expected} bytes but not its "
                    "declared SHA-256",
                    uri=self.location.uri,
                )
        self.verified = self.whole

    def _digest(self) -> str:
        if self._hasher is not None:
            return self._hasher.hexdigest()
        getter = getattr(self._chunks, "sha256_hexdigest", None)
        return str(getter()) if getter is not None else ""

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all remaining when negative); b"" at verified EOF."""
        if size < 0:
            parts = [self._buffer] if self._buffer else []
            self._buffer = b""
            while (chunk := await self._next_checked()) is not None:
                parts.append(chunk)
            return b"".join(parts)
        while not self._buffer:
            chunk = await self._next_checked()
            if chunk is None:
                return b""
            self._buffer = chunk
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    async def copy_to(
        self, destination: str | os.PathLike[str] | BinaryIO, *, durable: bool = True
    ) -> int:
        """Drain to a path or binary file, verifying at EOF; returns the bytes written.

        A path only ever holds verified bytes: they go to a temporary file
        beside it, renamed over the path after the check passed (fsynced first
        unless ``durable=False``). On a hash mismatch or a short read the
        temporary file is removed and an existing file at the path is left as
        it was. A file object gets the bytes as they come; the error at EOF
        says they are not the object's.
        """
        if isinstance(destination, str | os.PathLike):
            return await self._copy_to_path(Path(destination), durable)
        if self._drainable():
            return await self._blocking(lambda stopped: self._drain(destination, stopped))
        return await self._pipe(destination)

    def _drainable(self) -> bool:
        """Whether the chunk source copies itself in one blocking call (a whole local file)."""
        untouched = self._seen == 0 and not self._buffer and not self._eof and not self._closed
        return untouched and self.whole and callable(getattr(self._chunks, "drain_into", None))

    def _drain(self, destination: BinaryIO, stopped: Callable[[], bool]) -> int:
        """Blocking: the chunk source copies itself to ``destination``; then the EOF checks."""
        drain: Any = getattr(self._chunks, "drain_into")  # noqa: B009 (checked by _drainable)
        count = drain(destination, self.expected, stopped)
        if count is None:
            raise RuntimeError("the object stream was read before it was drained")
        self._eof = True
        self._seen = min(count, self.expected)
        if count > self.expected:
            raise ObjectOverlong(
                f"{self._what} is longer than its declared {self.expected} bytes",
                uri=self.location.uri,
            )
        self._finish()
        return self._seen

    async def _blocking(self, work: Callable[[Callable[[], bool]], int]) -> int:
        """Run ``work`` (given a stop flag) on a worker thread, then close the stream.

        Cancelled, it asks ``work`` to stop and waits for it before closing,
        so no thread still reads the object or writes the destination.
        """
        stop = threading.Event()
        running = asyncio.ensure_future(asyncio.to_thread(work, stop.is_set))
        try:
            return await asyncio.shield(running)
        except BaseException:
            stop.set()
            try:
                await asyncio.wait([running])
            except BaseException:
                running.add_done_callback(lambda _: asyncio.ensure_future(self.aclose()))
                raise
            raise
        finally:
            if running.done():
                if not running.cancelled():
                    running.exception()  # retrieved: raised above, or the result returned
                await self.aclose()

    async def _pipe(self, destination: BinaryIO) -> int:
        """Chunk N is written on a worker thread while N+1 is fetched (and hashed)."""
        written = 0
        writing: asyncio.Future[None] | None = None
        try:
            async for chunk in self:
                if writing is not None:
                    await writing
                writing = asyncio.ensure_future(asyncio.to_thread(write_all, destination, chunk))
                written += len(chunk)
            if writing is not None:
                await writing
        finally:
            # Never leave a write running into a file the caller closes or removes next.
            if writing is not None and not writing.done():
                with contextlib.suppress(BaseException):
                    await asyncio.wait([writing])
            if writing is not None and writing.done() and not writing.cancelled():
                writing.exception()
        return written

    async def _copy_to_path(self, path: Path, durable: bool) -> int:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        if self._drainable():
            # A whole local object: open, copy, check and rename in one worker-thread call.
            return await self._blocking(
                lambda stopped: _publish(
                    path, temporary, durable, lambda out: self._drain(out, stopped)
                )
            )
        fd = await asyncio.to_thread(_create, temporary)
        try:
            with os.fdopen(fd, "wb") as out:
                written = await self._pipe(out)
                await asyncio.to_thread(out.flush)
                if durable:
                    await asyncio.to_thread(os.fsync, out.fileno())
            await asyncio.to_thread(os.replace, temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        return written

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        closer = getattr(self._chunks, "aclose", None)
        if closer is not None:
            await closer()
        if self._close is not None:
            await self._close()

    async def __aenter__(self) -> ObjectReader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _create(temporary: Path) -> int:
    # O_EXCL: never write through someone else's file; 0o666 & umask, as open() would.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    return os.open(temporary, flags, 0o666)


def _publish(path: Path, temporary: Path, durable: bool, fill: Callable[[BinaryIO], int]) -> int:
    """Blocking: ``fill`` a new temporary file, then rename it to ``path``; removed on failure."""
    fd = _create(temporary)
    try:
        with os.fdopen(fd, "wb") as out:
            written = fill(out)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return written
