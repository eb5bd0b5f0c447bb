"""The blocking client: :class:`~lake_sdk.AsyncClient` driven on the SDK's background loop.

Same constructor, same options and same method names as the asyncio client;
results that stream come back as blocking views, named as httpx and lancedb
name them: :class:`QueryResult` for :class:`~lake_sdk.AsyncQueryResult`,
:class:`JobResult` for :class:`~lake_sdk.AsyncJobResult`,
:class:`ObjectReader` for :class:`~lake_sdk.AsyncObjectReader`,
:class:`ObjectStore` for :class:`~lake_sdk.AsyncObjectStore`, and
``client.jobs`` is a :class:`Jobs` for :class:`~lake_sdk.AsyncJobs`.

Every blocking client in the process shares one event loop on one daemon
thread (:class:`~lake_sdk._background_loop.BackgroundLoop`). Ctrl-C during a
blocking call cancels the coroutine it started (``client.jobs.query`` also
cancels its server-side job) and raises KeyboardInterrupt; the client stays usable.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight

from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects.capability import ReadCapability
from lake_objects.descriptor import StageDescriptor
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader as AsyncObjectReader
from lake_objects.s3 import DEFAULT_UPLOAD_CONCURRENCY
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore
from lake_sdk._appends import DEFAULT_APPEND_RETRIES
from lake_sdk._background_loop import BackgroundLoop
from lake_sdk._block_cache import DEFAULT_BLOCK_SIZE, DEFAULT_CACHE_BYTES
from lake_sdk._builder import ClientBuilder, connect_kwargs
from lake_sdk._client import DEFAULT_CONNECT_TIMEOUT_S, AsyncClient
from lake_sdk._deprecation import deprecated
from lake_sdk._files import DEFAULT_FILE_TTL_S, DEFAULT_STORAGE_TIMEOUT_S
from lake_sdk._jobs import AsyncJobResult, AsyncJobs, JobHandle
from lake_sdk._object_file import ObjectFile
from lake_sdk._results import AsyncQueryResult
from lake_sdk._schema_cache import SchemaCache
from lake_sdk._tables import TableInfo
from lake_sdk._time_travel import AsOf
from lake_sdk._transport import Transport

if TYPE_CHECKING:
    from lake_sdk.recordings import AddedRecording

__all__ = [
    "Client",
    "JobResult",
    "Jobs",
    "ObjectReader",
    "ObjectStore",
    "QueryResult",
    "connect",
]


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
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT_S,
        retries: int = DEFAULT_APPEND_RETRIES,
        schema_cache: SchemaCache | None = None,
        upload_checkpoint_dir: str | os.PathLike[str] | None = None,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
        progress: ProgressCallback | bool | None = None,
        query_only: bool = False,
        store: ManagedObjectStore | None = None,
        transport: Transport | None = None,
    ) -> None:
        inner = AsyncClient(
            url,
            token=token,
            ca_pem=ca_pem,
            server_name=server_name,
            connect_timeout=connect_timeout,
            storage_timeout=storage_timeout,
            retries=retries,
            schema_cache=schema_cache,
            upload_checkpoint_dir=upload_checkpoint_dir,
            upload_concurrency=upload_concurrency,
            progress=progress,
            query_only=query_only,
            store=store,
            transport=transport,
        )
        self._runner = BackgroundLoop.shared()
        self._inner = inner
        self._jobs = Jobs(self._runner, inner.jobs)

    @property
    def url(self) -> str:
        """The Query endpoint this client talks to."""
        return self._inner.url

    @property
    def jobs(self) -> Jobs:
        """Durable server-side query jobs: ``submit``, ``poll``, ``resume``, ``cancel``, ``query``."""
        return self._jobs

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def clone(self) -> Client:
        """Another handle on this connection, sharing its schema cache, stage and pending appends."""
        twin = object.__new__(Client)
        twin._runner = self._runner
        twin._inner = self._inner.clone()
        twin._jobs = self._jobs
        return twin

    def __enter__(self) -> Client:
        """Wait until Query answers (``connect_timeout``); close and raise if it does not."""
        self._runner.run(self._inner.__aenter__())
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (shared with clones) and the object store."""
        self._runner.run(self._inner.close())

    @classmethod
    @deprecated("lake_sdk.Client.builder(url)", "lake_sdk.Client(url, token=..., ca_pem=...)")
    def builder(cls, url: str) -> ClientBuilder:
        return ClientBuilder(url, connect=_connect)

    # -- SQL and schemas ---------------------------------------------------

    def query(self, sql: str, *, as_of: AsOf | None = None) -> QueryResult:
        """Run read-only SQL; the result is pinned to the table versions seen at planning.

        ``as_of`` (a version or an aware datetime) as :meth:`AsyncClient.query`.
        """
        return QueryResult(self._runner, self._runner.run(self._inner.query(sql, as_of=as_of)))

    def query_table(self, sql: str, *, as_of: AsOf | None = None) -> pa.Table:
        """Run SQL and collect the whole result."""
        return self._runner.run(self._inner.query_table(sql, as_of=as_of))

    def plan(self, sql: str, *, as_of: AsOf | None = None) -> flight.FlightInfo:
        """Plan ``sql`` without reading it: the pinned result's schema and endpoints."""
        return self._runner.run(self._inner.plan(sql, as_of=as_of))

    def versions(self, table: TableRef | str) -> pa.Table:
        """The table's retained versions, oldest first; see :meth:`AsyncClient.versions`."""
        return self._runner.run(self._inner.versions(table))

    def scan(
        self, sql: str, *, as_of: AsOf | None = None, shard: tuple[int, int] | None = None
    ) -> QueryResult:
        """Record batches of a pinned query, or of one shard ``(index, count)`` of it."""
        result = self._runner.run(self._inner.scan(sql, as_of=as_of, shard=shard))
        return QueryResult(self._runner, result)

    # -- durable jobs, 0.2 names (deprecated: use client.jobs) ---------------

    @deprecated("Client.query_async(sql)", "client.jobs.query(sql)")
    def query_async(self, sql: str) -> JobResult:
        return self._jobs.query(sql)

    @deprecated("Client.submit_async(sql)", "client.jobs.submit(sql)")
    def submit_async(self, sql: str) -> JobHandle:
        return self._jobs.submit(sql)

    @deprecated("Client.resume_async(handle)", "client.jobs.resume(handle)")
    def resume_async(self, handle: JobHandle) -> JobResult:
        return self._jobs.resume(handle)

    @deprecated("Client.poll_async(handle)", "client.jobs.poll(handle)")
    def poll_async(self, handle: JobHandle) -> JobHandle:
        return self._jobs.poll(handle)

    @deprecated("Client.cancel_async(handle)", "client.jobs.cancel(handle)")
    def cancel_async(self, handle: JobHandle) -> bool:
        return self._jobs.cancel(handle)

    def table_schema(self, table: TableRef | str) -> pa.Schema:
        """The table's Arrow schema, as Query's catalog knows it (from the schema cache)."""
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
        """Forget one cached schema (e.g. after the table was replaced)."""
        self._inner.invalidate_table_schema(table)

    def clear_schema_cache(self) -> None:
        """Forget every cached table schema."""
        self._inner.clear_schema_cache()

    # -- appends -----------------------------------------------------------

    def append_batches(
        self,
        table: TableRef | str,
        batches: Iterable[pa.RecordBatch] | pa.Table,
        *,
        operation_id: str | None = None,
    ) -> int:
        """Append exact-schema batches as one new table version and return it (retried safely)."""
        return self._runner.run(
            self._inner.append_batches(table, batches, operation_id=operation_id)
        )

    def ingest(self, table: TableRef | str, data: Any, *, operation_id: str | None = None) -> int:
        """Append any number of rows as ONE new table version; see :meth:`AsyncClient.ingest`."""
        return self._runner.run(self._inner.ingest(table, data, operation_id=operation_id))

    def insert(
        self, sql: str, params: Sequence[Any], *, progress: ProgressCallback | bool | None = None
    ) -> int:
        """``INSERT INTO ns.table (cols) VALUES (?, ...)`` with one row; returns the version."""
        return self._runner.run(self._inner.insert(sql, params, progress=progress))

    def insert_many(
        self,
        sql: str,
        rows: Sequence[Sequence[Any]],
        *,
        progress: ProgressCallback | bool | None = None,
    ) -> int:
        """Insert 1..=10,000 rows as one append and one table version."""
        return self._runner.run(self._inner.insert_many(sql, rows, progress=progress))

    def pending_append_ids(self) -> list[str]:
        """Operation ids of appends whose outcome a crash left unknown (at most 1,024)."""
        return self._runner.run(self._inner.pending_append_ids())

    def resume_pending_append(self, operation_id: str) -> int:
        """Replay one pending append with its own operation id; returns the committed version."""
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

    def object_store(self) -> ObjectStore:
        """This client's managed store (discovered through Query once, shared by clones)."""
        return ObjectStore(self._runner, self._runner.run(self._inner.object_store()))

    def cancel_upload(self, path: str | os.PathLike[str]) -> bool:
        """Abort the checkpointed upload of ``path`` (and delete its checkpoint)."""
        return self._runner.run(self._inner.cancel_upload(path))

    def open(self, location: DataLocation | Mapping[str, Any]) -> ObjectReader:
        """Stream an object directly from storage; EOF proves its size and SHA-256."""
        return ObjectReader(self._runner, self._runner.run(self._inner.open(location)))

    def open_range(self, location: DataLocation, start: int, end: int) -> ObjectReader:
        """Exactly bytes ``start..end`` (half-open) of an object, directly from storage."""
        reader = self._runner.run(self._inner.open_range(location, start, end))
        return ObjectReader(self._runner, reader)

    def open_file(
        self,
        location: DataLocation,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        read_ahead: int | None = None,
        ttl: float | timedelta = DEFAULT_FILE_TTL_S,
    ) -> ObjectFile:
        """A seekable, read-only binary file over exact range reads; see :meth:`AsyncClient.open_file`."""
        # The file's fetches run on the background loop; its reads block the caller.
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
        """A presigned GET (1 s..=1 h) signed with this process's credentials (S3 only)."""
        return self._runner.run(self._inner.presign_read(location, ttl))

    def open_via_query(self, location: DataLocation, ttl: float | timedelta) -> ObjectReader:
        """Read through a capability Query signs (needs no storage credentials here)."""
        reader = self._runner.run(self._inner.open_via_query(location, ttl))
        return ObjectReader(self._runner, reader)

    def open_range_via_query(
        self, location: DataLocation, start: int, end: int, ttl: float | timedelta
    ) -> ObjectReader:
        """Bytes ``start..end`` through a capability Query signs for exactly that range."""
        reader = self._runner.run(self._inner.open_range_via_query(location, start, end, ttl))
        return ObjectReader(self._runner, reader)

    def presign_read_via_query(
        self, location: DataLocation, ttl: float | timedelta
    ) -> ReadCapability:
        """The capability itself: a bearer URL and headers; never log them."""
        return self._runner.run(self._inner.presign_read_via_query(location, ttl))


class Jobs:
    """``Client.jobs``: durable server-side query jobs, blocking (see :class:`~lake_sdk.AsyncJobs`)."""

    def __init__(self, runner: BackgroundLoop, jobs: AsyncJobs) -> None:
        self._runner = runner
        self._jobs = jobs

    def __repr__(self) -> str:
        return repr(self._jobs).removeprefix("Async")

    def query(self, sql: str) -> JobResult:
        """Run SQL as a durable job and stream its result; the job is released once read.

        Ctrl-C while it waits cancels the job.
        """
        return JobResult(self._runner, self._runner.run(self._jobs.query(sql)))

    def submit(self, sql: str) -> JobHandle:
        """Submit SQL as a durable job; checkpoint ``handle.to_json()`` to resume it anywhere."""
        return self._runner.run(self._jobs.submit(sql))

    def resume(self, handle: JobHandle) -> JobResult:
        """Wait for a submitted job (through any replica) and stream its result."""
        return JobResult(self._runner, self._runner.run(self._jobs.resume(handle)))

    def wait(self, handle: JobHandle) -> JobHandle:
        """Wait until the job is done; the final handle. Raises its error if it failed."""
        return self._runner.run(self._jobs.wait(handle))

    def poll(self, handle: JobHandle) -> JobHandle:
        """One non-blocking poll: the refreshed handle (``state``, and ``error`` if failed)."""
        return self._runner.run(self._jobs.poll(handle))

    def cancel(self, handle: JobHandle) -> bool:
        """Cancel a job through CancelFlightInfo; its result parts are never served after."""
        return self._runner.run(self._jobs.cancel(handle))


class QueryResult:
    """A blocking :class:`~lake_sdk.AsyncQueryResult`: iterate it or call :meth:`to_table`."""

    def __init__(self, runner: BackgroundLoop, result: AsyncQueryResult) -> None:
        self._runner = runner
        self._result = result
        self.schema = result.schema

    def __repr__(self) -> str:
        return repr(self._result).removeprefix("Async")

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while (batch := self.next_batch()) is not None:
            yield batch

    def next_batch(self) -> pa.RecordBatch | None:
        """The next batch, or None at the end of the result."""
        return self._runner.run(self._result.next_batch())

    def to_table(self) -> pa.Table:
        """The whole result as one Arrow table."""
        return self._runner.run(self._result.to_table())

    def to_pandas(self) -> Any:
        """The whole result as a ``pandas.DataFrame`` (needs ``lake-sdk[pandas]``)."""
        return self._runner.run(self._result.to_pandas())

    def to_polars(self) -> Any:
        """The whole result as a ``polars.DataFrame`` (needs ``lake-sdk[polars]``)."""
        return self._runner.run(self._result.to_polars())

    def cancel(self) -> None:
        """Stop reading early (the server stops sending)."""
        self._result.cancel()


class JobResult(QueryResult):
    """A blocking :class:`~lake_sdk.AsyncJobResult`: a finished job's result and its ``handle``."""

    _result: AsyncJobResult

    def __init__(self, runner: BackgroundLoop, result: AsyncJobResult) -> None:
        super().__init__(runner, result)
        self.handle = result.handle


class ObjectReader:
    """A blocking :class:`~lake_sdk.AsyncObjectReader` (size and SHA-256 verified at EOF)."""

    def __init__(self, runner: BackgroundLoop, reader: AsyncObjectReader) -> None:
        self._runner = runner
        self._reader = reader

    def __repr__(self) -> str:
        return f"Blocking{self._reader!r}"

    @property
    def verified(self) -> bool:
        """True once the whole object was read and its size and SHA-256 matched."""
        return self._reader.verified

    @property
    def expected(self) -> int:
        """How many bytes this reader yields in all."""
        return self._reader.expected

    @property
    def bytes_read(self) -> int:
        """How many bytes were read so far."""
        return self._reader.bytes_read

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that remain with -1); b"" at EOF."""
        return self._runner.run(self._reader.read(size))

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(1024 * 1024):
            yield chunk

    def copy_to(self, destination: Any, *, durable: bool = True) -> int:
        """Copy the rest to a path or binary file; returns the bytes copied.

        A path gets the bytes only once verified (fsynced first unless ``durable=False``).
        """
        return self._runner.run(self._reader.copy_to(destination, durable=durable))

    def close(self) -> None:
        """Release the connection (reading stops)."""
        self._runner.run(self._reader.aclose())

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ObjectStore:
    """A blocking :class:`~lake_sdk.AsyncObjectStore`, the client's managed stage."""

    def __init__(self, runner: BackgroundLoop, store: ManagedObjectStore) -> None:
        self._runner = runner
        self.store = store

    def __repr__(self) -> str:
        return f"Blocking{self.store!r}"

    @property
    def descriptor(self) -> StageDescriptor:
        """The stage's descriptor (kind, URI, tenant scope)."""
        return self.store.descriptor

    @property
    def scope(self) -> Any:
        """The tenant scope every location must fall inside."""
        return self.store.scope

    def check(self, location: DataLocation) -> str:
        """The object's name inside the stage; LocationOutsideStage before any I/O."""
        return self.store.check(location)

    def upload(
        self,
        upload: FileUpload,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> DataLocation:
        """Store the upload's bytes as a new object and return its DataLocation."""
        return self._runner.run(
            self.store.upload(upload, checkpoint_dir=checkpoint_dir, progress=progress)
        )

    def open(self, location: DataLocation) -> ObjectReader:
        """A reader that proves size and SHA-256 when drained to EOF."""
        return ObjectReader(self._runner, self._runner.run(self.store.open(location)))

    def open_range(self, location: DataLocation, start: int, end: int) -> ObjectReader:
        """Exactly bytes ``start..end`` (half-open); bad ranges fail before any I/O."""
        reader = self._runner.run(self.store.open_range(location, start, end))
        return ObjectReader(self._runner, reader)

    def map_range(self, location: DataLocation, start: int, end: int) -> memoryview | None:
        """Bytes ``start..end`` of a local stage's file, mapped read-only (no copy); None on S3.

        Checked as :meth:`open_range` is; where it is None, read with :meth:`open_range`.
        """
        return self._runner.run(self.store.map_range(location, start, end))

    def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        """A bearer GET capability for one object (S3 stages only)."""
        return self._runner.run(self.store.presign_read(location, ttl))

    def cancel_upload(
        self, path: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str]
    ) -> bool:
        """Abort the checkpointed upload of ``path``; True if there was one."""
        return self._runner.run(self.store.cancel_upload(path, checkpoint_dir))

    def close(self) -> None:
        """Release the store's connections."""
        self._runner.run(self.store.close())


def _connect(url: str, **old_kwargs: Any) -> Client:
    client = Client(url, **connect_kwargs(old_kwargs))
    return client.__enter__()


@deprecated("lake_sdk.connect(url, ...)", "with lake_sdk.Client(url, ...) as client")
def connect(url: str, **kwargs: Any) -> Client:
    """Deprecated: connect to a Lake Query endpoint and return a blocking client."""
    return _connect(url, **kwargs)
