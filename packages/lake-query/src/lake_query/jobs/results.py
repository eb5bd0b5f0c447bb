"""The async result store seam: immutable part objects and write-once manifests.

Keys are ``<job>/<attempt>/part-NNNNN.arrows`` and ``<job>/<attempt>/manifest.json``.
A part becomes an object only when complete (local: rename of a synced
temporary file; S3: one PUT); a manifest is written once (local: hard link,
which fails if the name exists; S3: ``If-None-Match: *``), so a reader either
sees a whole result or none. :class:`LocalResults` lives in
``async-query-results/`` beside the catalog, :class:`S3Results` under
``LAKE_ASYNC_RESULT_PREFIX`` in the bucket.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lake_core.durable import fsync_dir
from lake_core.errors import Unavailable
from lake_objects.s3 import s3_client

__all__ = ["CHUNK_BYTES", "LocalResults", "ResultStore", "S3Results"]

#: Parts are written and read in chunks of this size.
CHUNK_BYTES = 64 * 1024


class ResultStore(abc.ABC):
    @abc.abstractmethod
    async def write_object(self, key: str, chunks: AsyncIterator[bytes]) -> int:
        """Store the chunks as one immutable object, visible only once complete."""

    @abc.abstractmethod
    async def write_once(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists (False then)."""

    @abc.abstractmethod
    async def read_bytes(self, key: str) -> bytes | None:
        """A small object whole (a manifest), or None."""

    @abc.abstractmethod
    def read_chunks(self, key: str) -> AsyncIterator[bytes]:
        """An object's bytes in chunks; NotFound-like absence raises FileNotFoundError."""

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

    async def write_object(self, key: str, chunks: AsyncIterator[bytes]) -> int:
        path = self._path(key)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        temp = path.with_name(path.name + f".{os.getpid()}.tmp")
        out = await asyncio.to_thread(open, temp, "wb")
        written = 0
        batch: list[bytes] = []
        try:
            async for chunk in chunks:
                batch.append(chunk)
                written += len(chunk)
                if len(batch) >= 16:  # one thread hop per MiB, not per 64 KiB chunk
                    await asyncio.to_thread(out.writelines, batch)
                    batch = []
            await asyncio.to_thread(out.writelines, batch)
            await asyncio.to_thread(out.flush)
            await asyncio.to_thread(os.fsync, out.fileno())
        except BaseException:
            out.close()
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        out.close()
        await asyncio.to_thread(os.replace, temp, path)
        await asyncio.to_thread(fsync_dir, path.parent)
        return written

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

    async def delete_prefix(self, prefix: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._path(prefix), True)


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

    async def write_object(self, key: str, chunks: AsyncIterator[bytes]) -> int:
        # A part is at most 64 MiB: one PUT once it is complete, never a partial object.
        body = bytearray()
        async for chunk in chunks:
            body += chunk
        try:
            await self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(body))
        except Exception:
            raise Unavailable("object storage did not accept an async result part") from None
        return len(body)

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
