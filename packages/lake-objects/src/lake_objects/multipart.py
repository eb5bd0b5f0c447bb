"""The S3 multipart pipeline: parts read and hashed in order, uploaded concurrently.

Each part takes one of ``concurrency`` slots before it is read (and hashed,
on a worker thread, so SHA-256 follows source order) and keeps it until its
upload finished: at most ``part_size x concurrency`` bytes of parts exist per
object, whatever its size, and the next part is read while the others are in
flight. Parts can complete out of order; ``on_durable`` is called, in
order and one at a time, whenever the contiguous run of completed parts
grows, with the SHA-256 of exactly that prefix (this is what checkpoints
record). The caller owns creating, completing and aborting the upload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lake_objects._body import PartBody
from lake_objects.errors import TooManyParts
from lake_objects.source import ChunkSource

__all__ = ["MAX_PARTS", "Part", "PartReader", "upload_parts"]

#: S3's limit on parts per multipart upload.
MAX_PARTS = 10_000


@dataclass(frozen=True)
class Part:
    number: int
    etag: str
    size: int


class PartReader:
    """Reads part-sized chunks and hashes them in source order, off the event loop."""

    def __init__(self, source: ChunkSource, hasher: Any, *, digests: bool) -> None:
        self.source = source
        self.hasher = hasher
        self._digests = digests

    def _read_hash_blocking(self) -> tuple[bytes, str]:
        data = self.source.read_chunk_blocking()
        return data, self._update(data)

    def _update(self, data: bytes) -> str:
        if data:
            self.hasher.update(data)
        return self.hasher.copy().hexdigest() if self._digests and data else ""

    async def next(self) -> tuple[bytes, str]:
        """The next part and, with digests on, the SHA-256 of everything read so far."""
        if self.source.blocking:
            return await asyncio.to_thread(self._read_hash_blocking)
        data = await self.source.read_chunk()
        return data, await asyncio.to_thread(self._update, data)


DurableHook = Callable[[list[Part], str], Awaitable[None]]


async def upload_parts(
    client: Any,
    *,
    bucket: str,
    key: str,
    upload_id: str,
    reader: PartReader,
    done: list[Part],
    concurrency: int,
    max_parts: int,
    uri: str,
    first: list[tuple[bytes, str]] | None = None,
    on_durable: DurableHook | None = None,
    on_part: Callable[[int], None] | None = None,
    stall_timeout_s: float | None = None,
) -> list[Part]:
    """Upload every remaining part; return all parts in order. Raises on the first failure.

    ``first`` may hold a part the caller already read; it is popped, so no frame
    keeps that part alive after its upload. ``stall_timeout_s`` bounds how long a
    part's body may go without S3 taking a byte of it (:class:`PartBody`).
    """
    slots = asyncio.Semaphore(concurrency)
    parts = list(done)
    completed: dict[int, Part] = {}
    digests: dict[int, str] = {}
    failures: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()
    durable_lock = asyncio.Lock()

    async def advance() -> None:
        async with durable_lock:
            before = len(parts)
            while len(parts) + 1 in completed:
                parts.append(completed.pop(len(parts) + 1))
            if len(parts) == before:
                return
            digest = digests.get(len(parts), "")
            for number in [n for n in digests if n <= len(parts)]:
                del digests[number]
            if on_durable is not None:
                await on_durable(list(parts), digest)

    async def send(number: int, body: PartBody) -> None:
        size = len(body)
        try:
            reply = await client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            )
            completed[number] = Part(number, str(reply["ETag"]), size)
            if on_part is not None:
                on_part(size)
            await advance()
        finally:
            body.release()
            slots.release()

    def record(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]

    number = len(done) + 1
    running: list[asyncio.Task[None]] = []
    try:
        while True:
            # Take a slot before reading: at most `concurrency` parts exist at
            # once (read, hashing or in flight), whatever the object's size.
            await slots.acquire()
            if failures:
                slots.release()
                raise failures[0]
            item = first.pop() if first else await reader.next()
            data, digest = item
            if not data:
                slots.release()
                break
            if number > max_parts:
                slots.release()
                raise TooManyParts(
                    f"upload of {uri!r} needs more than {max_parts:,} parts "
                    f"of {len(data) // (1024 * 1024)} MiB; S3 allows no more"
                )
            digests[number] = digest
            task = asyncio.create_task(send(number, PartBody(data, stall_timeout_s)))
            tasks.add(task)
            running.append(task)
            task.add_done_callback(record)
            number += 1
            del data, item
        await asyncio.gather(*running)
    except BaseException:
        pending: list[asyncio.Task[Any]] = [t for t in tasks if not t.done()]
        for waiting in pending:
            waiting.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise
    return parts
