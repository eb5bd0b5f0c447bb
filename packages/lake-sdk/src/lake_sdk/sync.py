"""The blocking facade: the async client driven on a private event loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects.capability import ReadCapability
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader
from lake_sdk.builder import ClientBuilder
from lake_sdk.client import LakeClient

__all__ = ["Client", "connect"]

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="lake-sdk", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Client:
    """A blocking Lake client; see :class:`lake_sdk.LakeClient` for the async one."""

    def __init__(self, runner: _LoopThread, inner: LakeClient) -> None:
        self._runner = runner
        self._inner = inner

    def __repr__(self) -> str:
        return f"Client({self._inner.url!r})"

    @classmethod
    def builder(cls, url: str) -> ClientBuilder:
        """Configure a blocking connection (bearer token, CA, server name)."""
        return ClientBuilder(url)

    def query(self, sql: str) -> Iterator[pa.RecordBatch]:
        result = self._runner.run(self._inner.query(sql))
        stream = result.__aiter__()
        while True:
            try:
                yield self._runner.run(_next(stream))
            except StopAsyncIteration:
                return

    def query_table(self, sql: str) -> pa.Table:
        return self._runner.run(self._inner.query_table(sql))

    def table_schema(self, table: TableRef | str) -> pa.Schema:
        return self._runner.run(self._inner.table_schema(table))

    def append_batches(
        self,
        table: TableRef | str,
        batches: Iterable[pa.RecordBatch] | pa.Table,
        *,
        operation_id: str | None = None,
    ) -> int:
        return self._runner.run(
            self._inner.append_batches(table, batches, operation_id=operation_id)
        )

    # FILE values (see LakeClient): inserts with uploads, pending appends, reads.

    def insert(
        self, sql: str, params: list[Any], *, progress: ProgressCallback | None = None
    ) -> int:
        return self._runner.run(self._inner.insert(sql, params, progress=progress))

    def insert_many(
        self, sql: str, rows: list[list[Any]], *, progress: ProgressCallback | None = None
    ) -> int:
        return self._runner.run(self._inner.insert_many(sql, rows, progress=progress))

    def pending_append_ids(self) -> list[str]:
        return self._runner.run(self._inner.pending_append_ids())

    def resume_pending_append(self, operation_id: str) -> int:
        return self._runner.run(self._inner.resume_pending_append(operation_id))

    def invalidate_table_schema(self, table: TableRef | str) -> None:
        self._inner.invalidate_table_schema(table)

    def clear_schema_cache(self) -> None:
        self._inner.clear_schema_cache()

    def open(self, location: DataLocation) -> SyncObjectReader:
        return SyncObjectReader(self._runner, self._runner.run(self._inner.open(location)))

    def open_range(self, location: DataLocation, start: int, end: int) -> SyncObjectReader:
        reader = self._runner.run(self._inner.open_range(location, start, end))
        return SyncObjectReader(self._runner, reader)

    def presign_read(self, location: DataLocation, ttl: float) -> ReadCapability:
        return self._runner.run(self._inner.presign_read(location, ttl))

    def open_via_query(self, location: DataLocation, ttl: float) -> SyncObjectReader:
        reader = self._runner.run(self._inner.open_via_query(location, ttl))
        return SyncObjectReader(self._runner, reader)

    def open_range_via_query(
        self, location: DataLocation, start: int, end: int, ttl: float
    ) -> SyncObjectReader:
        reader = self._runner.run(self._inner.open_range_via_query(location, start, end, ttl))
        return SyncObjectReader(self._runner, reader)

    def presign_read_via_query(self, location: DataLocation, ttl: float) -> ReadCapability:
        return self._runner.run(self._inner.presign_read_via_query(location, ttl))

    def close(self) -> None:
        try:
            self._runner.run(self._inner.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class SyncObjectReader:
    """A blocking view of an :class:`~lake_objects.ObjectReader` (verified at EOF)."""

    def __init__(self, runner: _LoopThread, reader: ObjectReader) -> None:
        self._runner = runner
        self._reader = reader

    def __repr__(self) -> str:
        return f"Sync{self._reader!r}"

    @property
    def verified(self) -> bool:
        return self._reader.verified

    def read(self, size: int = -1) -> bytes:
        return self._runner.run(self._reader.read(size))

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(1024 * 1024):
            yield chunk

    def copy_to(self, destination: Any) -> int:
        return self._runner.run(self._reader.copy_to(destination))

    def close(self) -> None:
        self._runner.run(self._reader.aclose())

    def __enter__(self) -> SyncObjectReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


async def _next(stream: Any) -> pa.RecordBatch:
    batch: pa.RecordBatch = await stream.__anext__()
    return batch


def connect(url: str, **kwargs: Any) -> Client:
    """Connect to a Lake Query endpoint and return a blocking client."""
    runner = _LoopThread()
    try:
        inner = runner.run(LakeClient.connect(url, **kwargs))
    except BaseException:
        runner.stop()
        raise
    return Client(runner, inner)
