"""The async result store seam: immutable part objects and write-once manifests.

Keys are ``<job>/<attempt>/part-NNNNN.arrows`` and ``<job>/<attempt>/manifest.json``.
A part becomes an object only when complete (local: rename of a synced
temporary file; S3: one PUT, or a multipart upload of 8 MiB pieces, so a
part is never held whole in memory; a local part is handed to the disk every
:data:`WRITEBACK_BYTES` as it is written, so the fsync that ends it waits only
for the rest); a manifest is written once (local: hard link,
which fails if the name exists; S3: ``If-None-Match: *``), so a reader either
sees a whole result or none. :class:`LocalResults` lives in
``async-query-results/`` beside the catalog, :class:`S3Results` under
``LAKE_ASYNC_RESULT_PREFIX`` in the bucket.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import ctypes
import os
import shutil
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from lake_core.durable import fsync_dir
from lake_core.errors import Unavailable
from lake_objects.s3 import s3_client

__all__ = [
    "CHUNK_BYTES",
    "UPLOAD_PIECE_BYTES",
    "WRITEBACK_BYTES",
    "LocalResults",
    "ResultStore",
    "S3Results",
]

#: Parts are written and read in chunks of this size.
CHUNK_BYTES = 64 * 1024
#: An S3 part is uploaded in pieces of this size (S3's multipart minimum is 5 MiB).
UPLOAD_PIECE_BYTES = 8 * 1024 * 1024
#: A local part's bytes are handed to the disk (not yet synced) every this many.
WRITEBACK_BYTES = 8 * 1024 * 1024
_SYNC_FILE_RANGE_WRITE = 2


def _writeback() -> Callable[[int, int, int], None] | None:
    """Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``: start writing a range back, don't wait.

    Without it a part's whole 64 MiB reaches the disk in its closing fsync,
    on the job's critical path (~20 ms a part on an idle disk, several times
    that on a busy one); with it the fsync finds little left. Only a hint:
    the fsync is still what makes the part durable (and reports any write
    error), so a platform without the call, or a failing call, changes nothing.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> None:
        call(fd, offset, length, _SYNC_FILE_RANGE_WRITE)

    return start


_START_WRITEBACK = _writeback()


class ResultStore(abc.ABC):
    @abc.abstractmethod
    async def write_object(
        self, key: str, chunks: Iterator[bytes], executor: Executor | None = None
    ) -> int:
        """Store the chunks as one immutable object, visible only once complete.

        ``chunks`` blocks (it drains the encoder's channel): iterate it on
        ``executor`` (the worker pool's threads), never on the loop or its
        default executor, which polls and submissions need.
        """

    @abc.abstractmethod
    async def write_once(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists (False then)."""

    @abc.abstractmethod
    async def read_bytes(self, key: str) -> bytes | None:
        """A small object whole (a manifest), or None."""

    @abc.abstractmethod
    def read_chunks(self, key: str) -> AsyncIterator[bytes]:
        """An object's bytes in chunks; NotFound-like absence raises FileNotFoundError."""

    def read_blocking(self, key: str) -> Iterator[bytes] | None:
        """The same chunks from a blocking source, for one reader thread; None if remote."""
        return None

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (a job's results)."""

    async def close(self) -> None:  # noqa: B027 - optional
        pass


class LocalResults(ResultStore):
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalResults({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError("result key escapes the result root")
        return path

    def _write(self, path: Path, chunks: Iterator[bytes]) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(path.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        written = handed = 0
        try:
            with open(temp, "wb") as out:
                for chunk in chunks:
                    written += out.write(chunk)
                    if _START_WRITEBACK is not None and written - handed >= WRITEBACK_BYTES:
                        out.flush()
                        _START_WRITEBACK(out.fileno(), handed, written - handed)
                        handed = written
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        os.replace(temp, path)
        fsync_dir(path.parent)
        return written

    async def write_object(
        self, key: str, chunks: Iterator[bytes], executor: Executor | None = None
    ) -> int:
        # One thread writes the whole part: no hop back to the loop per chunk.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self._write, self._path(key), chunks)

    def _write_once(self, path: Path, data: bytes) -> bool:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(path.name + f".{os.getpid()}.tmp")
        with open(temp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temp, path)  # atomic, and refuses an existing name
        except FileExistsError:
            return False
        finally:
            temp.unlink()
        fsync_dir(path.parent)
        return True

    async def write_once(self, key: str, data: bytes) -> bool:
        return await asyncio.to_thread(self._write_once, self._path(key), data)

    async def read_bytes(self, key: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._path(key).read_bytes)
        except FileNotFoundError:
            return None

    async def read_chunks(self, key: str) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self._path(key), "rb")
        try:
            while True:
                chunk = await asyncio.to_thread(handle.read, 16 * CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
        finally:
            handle.close()

    def read_blocking(self, key: str) -> Iterator[bytes]:
        path = self._path(key)
        if not path.exists():
            raise FileNotFoundError(key)

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as handle:
                while chunk := handle.read(16 * CHUNK_BYTES):
                    yield chunk

        return chunks()

    async def delete_prefix(self, prefix: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._path(prefix), True)


def _gather(chunks: Iterator[bytes], limit: int) -> tuple[bytes, bool]:
    """At least ``limit`` bytes of ``chunks`` (fewer at their end), and whether they ended."""
    taken: list[bytes] = []
    size = 0
    for chunk in chunks:
        taken.append(chunk)
        size += len(chunk)
        if size >= limit:
            return b"".join(taken), False
    return b"".join(taken), True


class S3Results(ResultStore):
    """Parts and manifests under ``s3://bucket/prefix/``."""

    def __init__(self, bucket: str, prefix: str, *, endpoint_url: str | None, region: str) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._endpoint_url = endpoint_url
        self._region = region
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    def __repr__(self) -> str:
        return f"S3Results({self.bucket!r}, {self.prefix!r})"

    async def open(self) -> S3Results:
        self._client = await self._stack.enter_async_context(
            s3_client(self._endpoint_url, self._region)
        )
        return self

    async def close(self) -> None:
        await self._stack.aclose()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    async def write_object(
        self, key: str, chunks: Iterator[bytes], executor: Executor | None = None
    ) -> int:
        # Streamed in UPLOAD_PIECE_BYTES pieces; a part no larger is one PUT. Either way
        # the object appears only once complete (CompleteMultipartUpload is atomic).
        source = iter(chunks)
        loop = asyncio.get_running_loop()
        piece, ended = await loop.run_in_executor(executor, _gather, source, UPLOAD_PIECE_BYTES)
        name = self._key(key)
        if ended:
            await self._s3("put_object", Bucket=self.bucket, Key=name, Body=piece)
            return len(piece)
        upload = await self._s3("create_multipart_upload", Bucket=self.bucket, Key=name)
        target = {"Bucket": self.bucket, "Key": name, "UploadId": upload["UploadId"]}
        done: list[dict[str, Any]] = []
        written = 0
        try:
            while piece:
                number = len(done) + 1
                reply = await self._s3("upload_part", PartNumber=number, Body=piece, **target)
                done.append({"PartNumber": number, "ETag": reply["ETag"]})
                written += len(piece)
                if ended:
                    break
                piece, ended = await loop.run_in_executor(
                    executor, _gather, source, UPLOAD_PIECE_BYTES
                )
            await self._s3("complete_multipart_upload", MultipartUpload={"Parts": done}, **target)
        except BaseException:
            # A failed or cancelled part leaves no object and no billed fragments.
            with contextlib.suppress(Exception):
                await self._client.abort_multipart_upload(**target)
            raise
        return written

    async def _s3(self, operation: str, **params: Any) -> Any:
        try:
            return await getattr(self._client, operation)(**params)
        except Exception:
            raise Unavailable("object storage did not accept an async result part") from None

    async def write_once(self, key: str, data: bytes) -> bool:
        try:
            await self._client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
            )
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise Unavailable("object storage did not accept an async result manifest") from None
        return True

    async def read_bytes(self, key: str) -> bytes | None:
        try:
            reply = await self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            body = reply["Body"]
            try:
                data: bytes = await body.read()
            finally:
                body.close()
            return data
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404"):
                return None
            raise Unavailable("object storage did not answer") from None

    async def read_chunks(self, key: str) -> AsyncIterator[bytes]:
        try:
            reply = await self._client.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404"):
                raise FileNotFoundError(key) from None
            raise Unavailable("object storage did not answer") from None
        body = reply["Body"]
        try:
            while True:
                try:
                    chunk = await body.read(16 * CHUNK_BYTES)
                except Exception:
                    raise Unavailable("object storage did not answer") from None
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()  # a dropped client releases the connection at once

    async def delete_prefix(self, prefix: str) -> None:
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._key(prefix).rstrip("/") + "/"
            )
            async for page in pages:
                for item in page.get("Contents", []):
                    await self._client.delete_object(Bucket=self.bucket, Key=item["Key"])
        except Exception:
            raise Unavailable("object storage did not answer") from None
