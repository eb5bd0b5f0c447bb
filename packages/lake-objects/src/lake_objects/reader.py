"""Readers that never yield more than the DataLocation promises.

:class:`ObjectReader` wraps a raw chunk stream from local storage, S3 or an
HTTP capability. A whole-object reader counts bytes and hashes them as they
pass, and proves size and SHA-256 at EOF; a range reader proves it got
exactly ``end - start`` bytes. Both raise a typed
:class:`~lake_objects.errors.ObjectIntegrityError` and never hand out a byte
beyond the declared length. Memory stays at a chunk or two whatever the size
(a local whole-object read holds the next chunk read ahead).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from lake_core.models import DataLocation
from lake_objects.errors import HashMismatch, InvalidRange, ObjectOverlong, PrematureEof

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

    async def copy_to(self, destination: str | os.PathLike[str] | BinaryIO) -> int:
        """Drain to a path or binary file, verifying at EOF; returns the bytes written.

        A path only ever holds verified bytes: they go to a temporary file
        beside it, renamed over the path after the check passed. On a hash
        mismatch or a short read the temporary file is removed and an existing
        file at the path is left as it was.
        """
        if isinstance(destination, str | os.PathLike):
            return await self._copy_to_path(Path(destination))
        written = 0
        async for chunk in self:
            await asyncio.to_thread(destination.write, chunk)
            written += len(chunk)
        return written

    async def _copy_to_path(self, path: Path) -> int:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        # O_EXCL: never write through someone else's file; 0o666 & umask, as open() would.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        fd = await asyncio.to_thread(os.open, temporary, flags, 0o666)
        try:
            with os.fdopen(fd, "wb") as out:
                written = await self.copy_to(out)
                await asyncio.to_thread(out.flush)
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
