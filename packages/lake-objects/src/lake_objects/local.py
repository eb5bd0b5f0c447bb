"""The local stage: objects are files under ``<root>/tenants/<tenant>/``.

Uploads write a hidden temporary file next to the target, hash while
copying (on a worker thread), fsync it, rename it into place and fsync the
directory: an object is visible only complete. Reads refuse a path whose
real location (symlinks resolved) leaves the tenant directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mmap
import os
import stat
from typing import BinaryIO

from lake_core.durable import fsync_dir
from lake_core.errors import FailedPrecondition
from lake_core.ids import new_operation_id
from lake_core.models import DataLocation
from lake_objects.descriptor import StageDescriptor
from lake_objects.errors import LocationOutsideStage, ObjectNotFound, ObjectOverlong, PrematureEof
from lake_objects.file_chunks import FileChunks, HashedFileChunks
from lake_objects.progress import ProgressCallback, UploadProgress
from lake_objects.reader import ObjectReader, check_range
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore

__all__ = ["LOCAL_CHUNK_SIZE", "LocalObjectStore"]

#: Copy and read size for local objects.
LOCAL_CHUNK_SIZE = 4 * 1024 * 1024
OBJECTS_DIR = "objects"


class LocalObjectStore(ManagedObjectStore):
    """A tenant's child directory on the local file system."""

    def __init__(self, descriptor: StageDescriptor, **_options: object) -> None:
        if descriptor.kind != "local":
            raise ValueError("LocalObjectStore needs a local stage descriptor")
        super().__init__(descriptor)
        self.root = descriptor.local_root

    def _path(self, name: str) -> str:
        path = os.path.join(self.root, *name.split("/"))
        real_root = os.path.realpath(self.root)
        if not os.path.realpath(path).startswith(real_root + os.sep):
            raise LocationOutsideStage(f"object {name!r} resolves outside the tenant's stage")
        return path

    async def upload(
        self,
        upload: FileUpload,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> DataLocation:
        total = upload.validate()
        name = f"{OBJECTS_DIR}/{new_operation_id()}"
        uri = self.scope.uri_for(name)
        directory = os.path.join(self.root, OBJECTS_DIR)
        await asyncio.to_thread(os.makedirs, directory, 0o755, True)
        tmp = os.path.join(directory, f".{name.rsplit('/', 1)[1]}.partial")
        hasher = hashlib.sha256()
        size = 0
        source = upload.chunks(LOCAL_CHUNK_SIZE)
        out = await asyncio.to_thread(open, tmp, "xb")
        try:
            while True:
                data = await source.read_chunk()
                if not data:
                    break
                await asyncio.to_thread(_write_and_hash, out, hasher, data)
                size += len(data)
                if progress is not None:
                    progress(UploadProgress(upload.name, size, total))
            upload.check_unchanged(size)
            await asyncio.to_thread(_sync_close, out)
            try:
                await asyncio.to_thread(os.replace, tmp, self._path(name))
            except FileNotFoundError:
                # Garbage collection removes a partial file older than its safety age:
                # this upload ran longer than that. Nothing was stored; say so without paths.
                raise FailedPrecondition(
                    f"the upload of {upload.name!r} lost its temporary file before it completed "
                    "(lake gc removes partial uploads older than its --safety-age-secs); "
                    "nothing was stored: upload it again"
                ) from None
            await asyncio.to_thread(fsync_dir, directory)
        except BaseException:
            out.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        finally:
            source.close()
        if progress is not None:
            progress(UploadProgress(upload.name, size, total, finished=True))
        return DataLocation(
            uri=uri, media_type=upload.media_type, size_bytes=size, sha256=hasher.hexdigest()
        )

    async def _open_file(self, name: str) -> BinaryIO:
        path = self._path(name)
        try:
            file: BinaryIO = await asyncio.to_thread(open, path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            # A directory (a DataLocation naming the stage's own folder) is no object either.
            raise ObjectNotFound(f"object {self.scope.uri_for(name)!r} does not exist") from None
        return file

    async def _open(self, location: DataLocation, name: str) -> ObjectReader:
        file = await self._open_file(name)
        return ObjectReader(location, HashedFileChunks(file, LOCAL_CHUNK_SIZE), hashed_chunks=True)

    async def _open_range(
        self, location: DataLocation, name: str, start: int, end: int
    ) -> ObjectReader:
        file = await self._open_file(name)
        try:
            _check_size(location, os.fstat(file.fileno()).st_size)
        except BaseException:
            file.close()
            raise
        await asyncio.to_thread(file.seek, start)
        return ObjectReader(
            location, FileChunks(file, end - start, LOCAL_CHUNK_SIZE), start=start, end=end
        )

    async def map_range(self, location: DataLocation, start: int, end: int) -> memoryview:
        """The range as a view of the object's file mapped read-only: sent from the page cache.

        Objects are never rewritten in place (a new object is a new file,
        renamed into place complete), so a mapping made after the size check
        stays valid; an object deleted meanwhile stays readable until unmapped.
        """
        name = self.check(location)
        check_range(location, start, end)
        path = self._path(name)
        return await asyncio.to_thread(
            _map_range, path, self.scope.uri_for(name), location, start, end
        )


def _check_size(location: DataLocation, actual: int) -> None:
    # As S3's Content-Range total: a range of an object whose size changed is not exact.
    if actual != location.size_bytes:
        error = ObjectOverlong if actual > location.size_bytes else PrematureEof
        raise error(
            f"object {location.uri!r} is {actual} bytes, not its declared {location.size_bytes}",
            uri=location.uri,
        )


def _map_range(path: str, uri: str, location: DataLocation, start: int, end: int) -> memoryview:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise ObjectNotFound(f"object {uri!r} does not exist") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ObjectNotFound(f"object {uri!r} does not exist")
        _check_size(location, info.st_size)
        offset = start - start % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, end - offset, access=mmap.ACCESS_READ, offset=offset)
    finally:
        os.close(fd)  # the mapping keeps the file
    return memoryview(mapped)[start - offset :]


def _write_and_hash(out: BinaryIO, hasher: hashlib._Hash, data: bytes) -> None:
    out.write(data)
    hasher.update(data)


def _sync_close(out: BinaryIO) -> None:
    out.flush()
    os.fsync(out.fileno())
    out.close()
