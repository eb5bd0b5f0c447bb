"""``FileUpload``: what to upload, from a path or a one-shot reader.

A path-backed upload knows its size and can be re-read after a restart, so it
can resume from a checkpoint. A reader-backed upload (a binary file object or
an async iterable of bytes) is consumed once.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

from lake_core.filetype import MEDIA_TYPE_PATTERN
from lake_objects.errors import InvalidUpload

__all__ = ["FileUpload", "SourceIdentity", "SyncReader"]

_MEDIA_TYPE = re.compile(MEDIA_TYPE_PATTERN)


@runtime_checkable
class SyncReader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class SourceIdentity:
    """What a resumed upload compares to detect a changed source file."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, path: str) -> SourceIdentity:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidUpload(f"upload source {path!r} is not a regular file")
        return cls(path, info.st_size, info.st_mtime_ns, info.st_ino, info.st_dev)


def check_media_type(media_type: object) -> str:
    if not isinstance(media_type, str) or not _MEDIA_TYPE.fullmatch(media_type):
        raise InvalidUpload(
            f"media type {str(media_type)[:80]!r} must look like 'type/subtype' (at most 255 characters)"
        )
    return media_type


class FileUpload:
    """One object to upload: ``from_path`` (resumable) or ``from_reader`` (one-shot)."""

    def __init__(
        self,
        *,
        media_type: str,
        path: str | None = None,
        reader: SyncReader | AsyncIterable[bytes] | None = None,
        name: str | None = None,
    ) -> None:
        self.media_type = check_media_type(media_type)
        self.path = path
        self._reader = reader
        self._consumed = False
        #: The file as validate() found it (None for a reader).
        self._identity: SourceIdentity | None = None
        self.name = name or (os.path.basename(path) if path else "stream")

    def __repr__(self) -> str:
        source = f"path={self.path!r}" if self.path else "reader"
        return f"FileUpload({source}, media_type={self.media_type!r})"

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], media_type: str) -> FileUpload:
        """Upload a regular file; with a checkpoint directory it resumes after a restart."""
        return cls(media_type=media_type, path=os.path.abspath(os.fspath(path)))

    @classmethod
    def from_reader(
        cls,
        reader: BinaryIO | SyncReader | AsyncIterable[bytes],
        media_type: str,
        *,
        name: str = "stream",
    ) -> FileUpload:
        """Upload what a binary reader (or async iterable of bytes) yields, once."""
        if not isinstance(reader, SyncReader | AsyncIterable):
            raise InvalidUpload(
                "from_reader needs a binary file object or an async iterable of bytes"
            )
        return cls(media_type=media_type, reader=reader, name=name)

    @property
    def resumable(self) -> bool:
        return self.path is not None

    def validate(self) -> int | None:
        """Check the source before any upload starts; the size when it is known."""
        if self.path is not None:
            try:
                self._identity = SourceIdentity.of(self.path)
                return self._identity.size
            except OSError as exc:
                raise InvalidUpload(
                    f"upload source {self.path!r} is not readable: {exc.strerror}"
                ) from None
        if self._consumed:
            raise InvalidUpload("a reader-backed FileUpload can be uploaded only once")
        return None

    def check_unchanged(self, size: int) -> None:
        """After reading a file: InvalidUpload unless ``size`` bytes were read and the
        file is as :meth:`validate` found it (size, mtime, inode, device).

        A file written, truncated or replaced while it was read would otherwise be
        stored as a complete object: its DataLocation describes the torn bytes, so
        every later read verifies.
        """
        if self.path is None or self._identity is None:
            return
        try:
            now: SourceIdentity | None = SourceIdentity.of(self.path)
        except (OSError, InvalidUpload):
            now = None
        if size != self._identity.size or now != self._identity:
            raise InvalidUpload(
                f"upload source {self.path!r} changed while it was uploaded (read {size} of "
                f"{self._identity.size} bytes); it is not stored as a file value: upload it "
                "again once it is complete"
            )

    def chunks(self, chunk_size: int) -> ChunkSource:
        """A sequential source of ``chunk_size`` chunks (the last may be shorter)."""
        if self.path is not None:
            return _PathChunks(self.path, chunk_size)
        if self._consumed or self._reader is None:
            raise InvalidUpload("a reader-backed FileUpload can be uploaded only once")
        self._consumed = True
        if isinstance(self._reader, AsyncIterable):
            return _AsyncChunks(self._reader, chunk_size)
        return _SyncChunks(self._reader, chunk_size)


class ChunkSource:
    """Reads fixed-size chunks in order; ``read_chunk`` returns b"" at EOF."""

    offset = 0
    #: True when ``read_chunk_blocking`` may be called on a worker thread.
    blocking = False

    async def read_chunk(self) -> bytes:
        raise NotImplementedError

    def read_chunk_blocking(self) -> bytes:
        raise NotImplementedError

    async def skip(self, count: int) -> None:
        """Position after ``count`` bytes (path sources only)."""
        raise InvalidUpload("only path-backed uploads can resume")

    def close(self) -> None:
        pass


class _PathChunks(ChunkSource):
    blocking = True

    def __init__(self, path: str, chunk_size: int) -> None:
        self._file: BinaryIO = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._size = chunk_size

    def read_chunk_blocking(self) -> bytes:
        data = _read_full(self._file, self._size)
        self.offset += len(data)
        return data

    async def read_chunk(self) -> bytes:
        return await asyncio.to_thread(self.read_chunk_blocking)

    async def skip(self, count: int) -> None:
        await asyncio.to_thread(self._file.seek, count)
        self.offset = count

    def close(self) -> None:
        self._file.close()


class _SyncChunks(ChunkSource):
    blocking = True

    def __init__(self, reader: SyncReader, chunk_size: int) -> None:
        self._reader = reader
        self._size = chunk_size

    def read_chunk_blocking(self) -> bytes:
        data = _read_full(self._reader, self._size)
        self.offset += len(data)
        return data

    async def read_chunk(self) -> bytes:
        return await asyncio.to_thread(self.read_chunk_blocking)


class _AsyncChunks(ChunkSource):
    def __init__(self, source: AsyncIterable[bytes], chunk_size: int) -> None:
        self._iter: AsyncIterator[bytes] = aiter(source)
        self._size = chunk_size
        self._pending = bytearray()
        self._done = False

    async def read_chunk(self) -> bytes:
        while len(self._pending) < self._size and not self._done:
            try:
                piece = await anext(self._iter)
            except StopAsyncIteration:
                self._done = True
                break
            if not isinstance(piece, bytes | bytearray | memoryview):
                raise InvalidUpload("an async upload source must yield bytes")
            self._pending += piece
        data = bytes(self._pending[: self._size])
        del self._pending[: self._size]
        self.offset += len(data)
        return data


def _read_full(reader: SyncReader, size: int) -> bytes:
    """Read exactly ``size`` bytes unless EOF comes first (readers may return short reads)."""
    first = reader.read(size)
    if not isinstance(first, bytes | bytearray):
        raise InvalidUpload("an upload reader must return bytes")
    if len(first) == size or not first:
        return bytes(first)
    parts = [first]
    got = len(first)
    while got < size:
        more = reader.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
