"""The blocking client: :class:`~lake_sdk.AsyncClient` driven on a private event-loop thread.

Same constructor, same options and same method names as the async client;
results that stream (queries, object readers) come back as blocking views.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects.capability import ReadCapability
from lake_objects.descriptor import StageDescriptor
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader
from lake_objects.s3 import DEFAULT_UPLOAD_CONCURRENCY
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore
from lake_sdk._deprecation import deprecated
from lake_sdk.appends import DEFAULT_APPEND_RETRIES
from lake_sdk.block_cache import DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_BYTES
from lake_sdk.builder import ClientBuilder, connect_kwargs
from lake_sdk.client import DEFAULT_CONNECT_TIMEOUT_S, AsyncClient
from lake_sdk.files import DEFAULT_FILE_TTL_S
from lake_sdk.jobs import AsyncQueryHandle, AsyncQueryResult
from lake_sdk.object_file import ObjectFile
from lake_sdk.results import QueryResult
from lake_sdk.schema_cache import SchemaCache
from lake_sdk.tables import TableInfo
from lake_sdk.time_travel import AsOf

if TYPE_CHECKING:
    from lake_sdk.recordings import AddedRecording

__all__ = ["Client", "SyncObjectReader", "SyncObjectStore", "SyncQueryResult", "connect"]

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="lake-sdk", daemon=True)
        self._thread.start()
        self._stopped = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Client:
    """A blocking client of one Lake Query endpoint; options as :class:`~lake_sdk.AsyncClient`."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_pem: bytes | str | None = None,
        server_name: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        retries: int = DEFAULT_APPEND_RETRIES,
        schema_cache: SchemaCache | None = None,
        upload_checkpoint_dir: str | os.PathLike[str] | None = None,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
        progress: ProgressCallback | bool | None = None,
        query_only: bool = False,
        store: ManagedObjectStore | None = None,
    ) -> None:
        inner = AsyncClient(
            url,
            token=token,
            ca_pem=ca_pem,
            server_name=server_name,
            connect_timeout=connect_timeout,
            retries=retries,
            schema_cache=schema_cache,
            upload_checkpoint_dir=upload_checkpoint_dir,
            upload_concurrency=upload_concurrency,
            progress=progress,
            query_only=query_only,
            store=store,
        )
        self._runner = _LoopThread()
        self._inner = inner

    @property
    def url(self) -> str:
        return self._inner.url

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def clone(self) -> Client:
        """Another handle on this connection (and its loop thread, schema cache and stage)."""
        twin = object.__new__(Client)
        twin._runner = self._runner
        twin._inner = self._inner.clone()
        return twin

    def __enter__(self) -> Client:
        """Wait until Query answers (``connect_timeout``); close and raise if it does not."""
        try:
            self._runner.run(self._inner.__aenter__())
        except BaseException:
            self._runner.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (shared with clones) and stop the loop thread."""
        try:
            self._runner.run(self._inner.close())
        finally:
            self._runner.stop()

    @classmethod
    @deprecated("lake_sdk.Client.builder(url)", "lake_sdk.Client(url, token=..., ca_pem=...)")
    def builder(cls, url: str) -> ClientBuilder:
        return ClientBuilder(url, connect=_connect)

    # -- SQL and schemas ---------------------------------------------------

    def query(self, sql: str, *, as_of: AsOf | None = None) -> SyncQueryResult:
        return SyncQueryResult(self._runner, self._runner.run(self._inner.query(sql, as_of=as_of)))

    def query_table(self, sql: str, *, as_of: AsOf | None = None) -> pa.Table:
        return self._runner.run(self._inner.query_table(sql, as_of=as_of))

    def plan(self, sql: str, *, as_of: AsOf | None = None) -> flight.FlightInfo:
        """Plan ``sql`` without reading it: the pinned result's schema and endpoints."""
        return self._runner.run(self._inner.plan(sql, as_of=as_of))

    def versions(self, table: TableRef | str) -> pa.Table:
        return self._runner.run(self._inner.versions(table))

    def scan(
        self, sql: str, *, as_of: AsOf | None = None, shard: tuple[int, int] | None = None
    ) -> SyncQueryResult:
        result = self._runner.run(self._inner.scan(sql, as_of=as_of, shard=shard))
        return SyncQueryResult(self._runner, result)

    # -- durable async queries ----------------------------------------------

    def query_async(self, sql: str) -> SyncQueryResult:
        return SyncQueryResult(self._runner, self._runner.run(self._inner.query_async(sql)))

    def submit_async(self, sql: str) -> AsyncQueryHandle:
        return self._runner.run(self._inner.submit_async(sql))

    def resume_async(self, handle: AsyncQueryHandle) -> SyncQueryResult:
        return SyncQueryResult(self._runner, self._runner.run(self._inner.resume_async(handle)))

    def poll_async(self, handle: AsyncQueryHandle) -> AsyncQueryHandle:
        return self._runner.run(self._inner.poll_async(handle))

    def cancel_async(self, handle: AsyncQueryHandle) -> bool:
        return self._runner.run(self._inner.cancel_async(handle))

    def table_schema(self, table: TableRef | str) -> pa.Schema:
        return self._runner.run(self._inner.table_schema(table))

    # -- tables ------------------------------------------------------------

    def create_table(self, table: TableRef | str, schema: pa.Schema) -> TableInfo:
        """Create ``table`` with this Arrow schema; see :meth:`AsyncClient.create_table`."""
        return self._runner.run(self._inner.create_table(table, schema))

    def list_tables(self) -> list[TableInfo]:
        """Every table this client may see, by namespace then name."""
        return self._runner.run(self._inner.list_tables())

    def describe_table(self, table: TableRef | str) -> TableInfo:
        """``table``'s current version and schema."""
        return self._runner.run(self._inner.describe_table(table))

    def drop_table(self, table: TableRef | str) -> int:
        """Drop ``table`` (admin); returns the version it had when dropped."""
        return self._runner.run(self._inner.drop_table(table))

    def invalidate_table_schema(self, table: TableRef | str) -> None:
        self._inner.invalidate_table_schema(table)

    def clear_schema_cache(self) -> None:
        self._inner.clear_schema_cache()

    # -- appends -----------------------------------------------------------

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

    def ingest(self, table: TableRef | str, data: Any, *, operation_id: str | None = None) -> int:
        return self._runner.run(self._inner.ingest(table, data, operation_id=operation_id))

    def insert(
        self, sql: str, params: Sequence[Any], *, progress: ProgressCallback | bool | None = None
    ) -> int:
        return self._runner.run(self._inner.insert(sql, params, progress=progress))

    def insert_many(
        self,
        sql: str,
        rows: Sequence[Sequence[Any]],
        *,
        progress: ProgressCallback | bool | None = None,
    ) -> int:
        return self._runner.run(self._inner.insert_many(sql, rows, progress=progress))

    def pending_append_ids(self) -> list[str]:
        return self._runner.run(self._inner.pending_append_ids())

    def resume_pending_append(self, operation_id: str) -> int:
        return self._runner.run(self._inner.resume_pending_append(operation_id))

    # -- recordings (lake-sdk[mcap]) ------------------------------------------

    def add_recording(
        self,
        table: TableRef | str,
        path: str | os.PathLike[str],
        *,
        values: Mapping[str, Any] | None = None,
        progress: ProgressCallback | bool | None = None,
    ) -> AddedRecording:
        """Add one MCAP recording to a recordings table; see :meth:`AsyncClient.add_recording`."""
        return self._runner.run(
            self._inner.add_recording(table, path, values=values, progress=progress)
        )

    # -- FILE values -------------------------------------------------------

    def object_store(self) -> SyncObjectStore:
        return SyncObjectStore(self._runner, self._runner.run(self._inner.object_store()))

    def cancel_upload(self, path: str | os.PathLike[str]) -> bool:
        return self._runner.run(self._inner.cancel_upload(path))

    def open(self, location: DataLocation | Mapping[str, Any]) -> SyncObjectReader:
        return SyncObjectReader(self._runner, self._runner.run(self._inner.open(location)))

    def open_range(self, location: DataLocation, start: int, end: int) -> SyncObjectReader:
        reader = self._runner.run(self._inner.open_range(location, start, end))
        return SyncObjectReader(self._runner, reader)

    def open_file(
        self,
        location: DataLocation,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        read_ahead: int | None = None,
        ttl: float | timedelta = DEFAULT_FILE_TTL_S,
    ) -> ObjectFile:
        # The file's fetches run on this client's loop thread; its reads block the caller.
        return self._runner.run(
            self._inner.open_file(
                location,
                block_size=block_size,
                cache_bytes=cache_bytes,
                read_ahead=read_ahead,
                ttl=ttl,
            )
        )

    def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        return self._runner.run(self._inner.presign_read(location, ttl))

    def open_via_query(self, location: DataLocation, ttl: float | timedelta) -> SyncObjectReader:
        reader = self._runner.run(self._inner.open_via_query(location, ttl))
        return SyncObjectReader(self._runner, reader)

    def open_range_via_query(
        self, location: DataLocation, start: int, end: int, ttl: float | timedelta
    ) -> SyncObjectReader:
        reader = self._runner.run(self._inner.open_range_via_query(location, start, end, ttl))
        return SyncObjectReader(self._runner, reader)

    def presign_read_via_query(
        self, location: DataLocation, ttl: float | timedelta
    ) -> ReadCapability:
        return self._runner.run(self._inner.presign_read_via_query(location, ttl))


class SyncQueryResult:
    """A blocking view of a :class:`~lake_sdk.QueryResult`: iterate it or call :meth:`to_table`."""

    def __init__(self, runner: _LoopThread, result: QueryResult | AsyncQueryResult) -> None:
        self._runner = runner
        self._result = result
        self.schema = result.schema

    def __repr__(self) -> str:
        return f"Sync{self._result!r}"

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while (batch := self._runner.run(self._result.next_batch())) is not None:
            yield batch

    def to_table(self) -> pa.Table:
        return self._runner.run(self._result.to_table())

    def to_pandas(self) -> Any:
        """The whole result as a ``pandas.DataFrame`` (needs ``lake-sdk[pandas]``)."""
        return self._runner.run(self._result.to_pandas())

    def to_polars(self) -> Any:
        """The whole result as a ``polars.DataFrame`` (needs ``lake-sdk[polars]``)."""
        return self._runner.run(self._result.to_polars())

    def cancel(self) -> None:
        self._result.cancel()


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


class SyncObjectStore:
    """A blocking view of the client's :class:`~lake_objects.ManagedObjectStore`."""

    def __init__(self, runner: _LoopThread, store: ManagedObjectStore) -> None:
        self._runner = runner
        self.store = store

    def __repr__(self) -> str:
        return f"Sync{self.store!r}"

    @property
    def descriptor(self) -> StageDescriptor:
        return self.store.descriptor

    def check(self, location: DataLocation) -> str:
        return self.store.check(location)

    def upload(
        self,
        upload: FileUpload,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> DataLocation:
        return self._runner.run(
            self.store.upload(upload, checkpoint_dir=checkpoint_dir, progress=progress)
        )

    def open(self, location: DataLocation) -> SyncObjectReader:
        return SyncObjectReader(self._runner, self._runner.run(self.store.open(location)))

    def open_range(self, location: DataLocation, start: int, end: int) -> SyncObjectReader:
        reader = self._runner.run(self.store.open_range(location, start, end))
        return SyncObjectReader(self._runner, reader)


def _connect(url: str, **old_kwargs: Any) -> Client:
    client = Client(url, **connect_kwargs(old_kwargs))
    return client.__enter__()


@deprecated("lake_sdk.connect(url, ...)", "with lake_sdk.Client(url, ...) as client")
def connect(url: str, **kwargs: Any) -> Client:
    """Deprecated: connect to a Lake Query endpoint and return a blocking client."""
    return _connect(url, **kwargs)
