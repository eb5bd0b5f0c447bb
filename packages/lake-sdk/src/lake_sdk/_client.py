"""The asyncio Lake client: SQL over Flight SQL, appends through Query, FILE values.

The client talks to one Query endpoint only; Query forwards appends to the
commit authority. FILE bytes go directly between this process and the managed
object stage. It is composed of small parts shared with its clones: the
:class:`~lake_sdk.Transport` (a Flight connection unless one is passed in), the :class:`~lake_sdk.SchemaCache`,
the :class:`~lake_sdk._files.FileAccess` (stage and object store) and the
:class:`~lake_sdk._appends.Appender` (retries and pending appends), and
``jobs``, the durable server-side query jobs (:class:`~lake_sdk.AsyncJobs`).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.flight as flight

from lake_core import protocol
from lake_core.errors import InvalidArgument
from lake_core.ids import new_operation_id
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_core.schemas import schema_from_base64
from lake_objects.capability import ReadCapability
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader as AsyncObjectReader
from lake_objects.s3 import DEFAULT_UPLOAD_CONCURRENCY
from lake_objects.store import ManagedObjectStore
from lake_sdk._appends import DEFAULT_APPEND_RETRIES, Appender, batch_list, validate_append
from lake_sdk._block_cache import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CACHE_BYTES,
    CacheLimits,
)
from lake_sdk._builder import LakeClientBuilder, connect_kwargs
from lake_sdk._deprecation import deprecated
from lake_sdk._files import (
    DEFAULT_FILE_TTL_S,
    DEFAULT_STORAGE_TIMEOUT_S,
    FileAccess,
    FileOptions,
)
from lake_sdk._frames import as_location
from lake_sdk._ingest import as_reader, ingest_descriptor
from lake_sdk._inserts import insert_rows
from lake_sdk._jobs import AsyncJobResult, AsyncJobs, JobCalls, JobHandle
from lake_sdk._object_file import ObjectFile
from lake_sdk._pending import PendingAppendStore
from lake_sdk._results import AsyncQueryResult
from lake_sdk._scans import check_as_of, check_shard, shard_endpoints
from lake_sdk._schema_cache import SchemaCache
from lake_sdk._tables import TableInfo, create_body, table_info, table_schema_of
from lake_sdk._time_travel import AsOf, as_of_sql, versions_sql
from lake_sdk._transport import Connection, ConnectOptions, Transport

if TYPE_CHECKING:
    from lake_sdk.recordings import AddedRecording

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "AsyncClient", "LakeClient"]

DEFAULT_CONNECT_TIMEOUT_S = 10.0


def _any(message: Any) -> bytes:
    from google.protobuf import any_pb2

    wrapper = any_pb2.Any()
    wrapper.Pack(message, type_url_prefix="type.googleapis.com/")
    data: bytes = wrapper.SerializeToString()
    return data


def _ref(table: TableRef | str) -> TableRef:
    return table if isinstance(table, TableRef) else TableRef.parse(table)


@dataclass
class _State:
    """What a client shares with its clones."""

    connection: Transport
    schemas: SchemaCache
    files: FileAccess
    appender: Appender
    connect_timeout: float
    jobs: JobCalls
    ready: bool = False  # Query answered once: later ``async with`` blocks skip the check
    closed: bool = False  # closing is final, for clones too


class AsyncClient:
    """An asyncio client of one Lake Query endpoint; see :mod:`lake_sdk` for how to open one.

    Options (keyword-only, validated here, before anything is sent):

    - ``token``: bearer token sent on every call (never shown in a repr or error);
    - ``ca_pem``, ``server_name``: verify Query's certificate against this CA
      bundle and expect this name in it (``https://`` endpoints only);
    - ``connect_timeout``: seconds entering ``async with`` waits for Query (10);
    - ``storage_timeout``: seconds object storage may stay silent during a FILE
      read or upload before it fails as ObjectStoreUnavailable (retryable; 30).
      It bounds a stall, not a transfer: a slow multi-GB read that keeps moving
      is never cut. A direct S3 request is tried three times, so a stalled S3
      surfaces within about three times this; a read through a Query
      capability within it;
    - ``retries``: how often an append whose outcome a transport failure left
      unknown is re-sent with the same operation id (0..=9, default 2);
    - ``schema_cache``: the :class:`~lake_sdk.SchemaCache` for table schemas
      (default 1,024 tables for 60 s);
    - ``upload_checkpoint_dir``: makes path uploads restart-resumable and appends
      durable (pending appends); ``upload_concurrency``: S3 parts in flight (1..=16, 4);
    - ``progress``: upload progress: None (default) draws a bar on an interactive
      terminal (not with ``LAKE_NO_PROGRESS=1``), False never, or your own callback;
    - ``query_only``: no storage access, FILE reads through Query-issued capabilities;
    - ``store``: use this object store instead of discovering the stage (embedders, tests);
    - ``transport``: send every call through this :class:`~lake_sdk.Transport`
      instead of a Flight connection to ``url`` (``token``, ``ca_pem`` and
      ``server_name`` are then the transport's business). Unit tests pass a
      :class:`~lake_sdk.MockTransport`, an in-memory Query, and need no server::

          transport = lake_sdk.MockTransport()
          transport.add_table("robots.runs", pa.table({"id": [1, 2]}))
          async with lake_sdk.AsyncClient("mock://", transport=transport) as client:
              assert (await client.query_table("SELECT * FROM robots.runs")).num_rows == 2

    Durable jobs (:attr:`jobs`) poll over their own gRPC channel to ``url``
    and are not sent through a passed-in transport.
    """

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
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float):
            raise InvalidArgument("connect_timeout must be a number of seconds")
        if not 0 < connect_timeout <= 3600:
            raise InvalidArgument(f"connect_timeout must be in (0, 3600] s, got {connect_timeout}")
        files = FileOptions.create(
            upload_checkpoint_dir=upload_checkpoint_dir,
            upload_concurrency=upload_concurrency,
            query_only=query_only,
            store=store,
            progress=progress,
            storage_timeout=storage_timeout,
        )
        options = ConnectOptions.create(token=token, ca_pem=ca_pem, server_name=server_name)
        schemas = schema_cache if schema_cache is not None else SchemaCache()
        if not isinstance(schemas, SchemaCache):
            raise InvalidArgument("schema_cache must be a lake_sdk.SchemaCache")
        if transport is not None and not isinstance(transport, Transport):
            raise InvalidArgument("transport must be a lake_sdk.Transport")
        connection = transport if transport is not None else Connection(url, options)
        pending = (
            None
            if files.upload_checkpoint_dir is None
            else PendingAppendStore(files.upload_checkpoint_dir)
        )
        appender = Appender(
            connection, retries=retries, pending=pending, schema_changed=schemas.invalidate
        )
        self._state = _State(
            connection,
            schemas,
            FileAccess(files, connection.action),
            appender,
            connect_timeout,
            JobCalls(connection),
        )
        self._jobs = AsyncJobs(connection, self._state.jobs)

    @property
    def url(self) -> str:
        """The Query endpoint this client talks to."""
        return self._state.connection.url

    @property
    def jobs(self) -> AsyncJobs:
        """Durable server-side query jobs: ``submit``, ``poll``, ``resume``, ``cancel``, ``query``."""
        return self._jobs

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def clone(self) -> AsyncClient:
        """Another handle on this connection, sharing its schema cache, stage and pending appends."""
        twin = object.__new__(type(self))
        twin._state = self._state
        twin._jobs = self._jobs
        return twin

    async def __aenter__(self) -> AsyncClient:
        """Wait until Query answers (``connect_timeout``); close and raise if it does not."""
        if not self._state.ready:
            try:
                await self._state.connection.wait_ready(self._state.connect_timeout)
            except BaseException:
                await self.close()
                raise
            self._state.ready = True
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection (shared with clones) and the object store."""
        self._state.closed = True
        await self._state.files.close()
        self._state.jobs.close()
        await self._state.connection.close()

    # -- SQL ---------------------------------------------------------------

    async def query(self, sql: str, *, as_of: AsOf | None = None) -> AsyncQueryResult:
        """Run read-only SQL; the result is pinned to the table versions seen at planning.

        ``as_of`` (a Lake version number or an aware datetime) reads every
        ``lake.<namespace>.<table>`` the SQL names at that version: the SQL
        is sent as :func:`lake_sdk.as_of_sql` rewrites it.
        """
        info = await self.plan(sql, as_of=as_of)
        return await self._read(info, info.endpoints)

    async def plan(self, sql: str, *, as_of: AsOf | None = None) -> flight.FlightInfo:
        """Plan ``sql`` without reading it: the pinned result's schema and endpoints.

        ``as_of`` as for :meth:`query`. Each endpoint carries a sealed ticket that any replica redeems for its
        part of the rows, until the ticket expires (``LAKE_QUERY_TICKET_TTL_SECS``);
        :mod:`lake_sdk.ray` hands them to Ray's workers this way.
        """
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidArgument("SQL must be a non-empty string")
        if as_of is not None:
            sql = as_of_sql(sql, as_of)
        command = flight_sql_pb2.CommandStatementQuery(query=sql)
        descriptor = flight.FlightDescriptor.for_command(_any(command))
        return await self._state.connection.flight_info(descriptor)

    async def scan(
        self, sql: str, *, as_of: AsOf | None = None, shard: tuple[int, int] | None = None
    ) -> AsyncQueryResult:
        """Record batches of a pinned query, or of one shard ``(index, count)`` of it.

        Shards of one pin are disjoint and together exactly the result
        (:mod:`lake_sdk._scans` says which endpoints each reads). ``as_of``
        (a table version or an aware datetime) pins the tables as they were
        then, so shards planned in different processes read the same rows.
        """
        selected = check_shard(shard)
        info = await self.plan(sql, as_of=check_as_of(as_of))
        return await self._read(info, shard_endpoints(info.endpoints, selected))

    async def _read(
        self, info: flight.FlightInfo, endpoints: Sequence[flight.FlightEndpoint]
    ) -> AsyncQueryResult:
        """Stream ``endpoints`` of ``info`` one after another (none: an empty result)."""
        connection = self._state.connection
        if not endpoints:
            return AsyncQueryResult(None, info.schema, {})
        # Each endpoint is redeemed where its location says (Query's data plane, if on).
        openers = [
            functools.partial(connection.at(e.locations).stream, e.ticket) for e in endpoints[1:]
        ]
        reader, trailers = await connection.at(endpoints[0].locations).stream(endpoints[0].ticket)
        return AsyncQueryResult(reader, info.schema, trailers, openers)

    async def query_table(self, sql: str, *, as_of: AsOf | None = None) -> pa.Table:
        """Run SQL and collect the whole result."""
        return await (await self.query(sql, as_of=as_of)).to_table()

    async def versions(self, table: TableRef | str) -> pa.Table:
        """The table's retained versions, oldest first (``lake.ns."t$versions"``).

        Columns: version, committed_at (UTC), operation (create, append,
        maintenance), rows_added, engine_version, operation_ids (the appends
        each version holds).
        """
        return await self.query_table(versions_sql(_ref(table)))

    # -- durable jobs, 0.2 names (deprecated: use client.jobs) ---------------

    @deprecated("AsyncClient.query_async(sql)", "client.jobs.query(sql)")
    async def query_async(self, sql: str) -> AsyncJobResult:
        return await self._jobs.query(sql)

    @deprecated("AsyncClient.submit_async(sql)", "client.jobs.submit(sql)")
    async def submit_async(self, sql: str) -> JobHandle:
        return await self._jobs.submit(sql)

    @deprecated("AsyncClient.resume_async(handle)", "client.jobs.resume(handle)")
    async def resume_async(self, handle: JobHandle) -> AsyncJobResult:
        return await self._jobs.resume(handle)

    @deprecated("AsyncClient.poll_async(handle)", "client.jobs.poll(handle)")
    async def poll_async(self, handle: JobHandle) -> JobHandle:
        return await self._jobs.poll(handle)

    @deprecated("AsyncClient.cancel_async(handle)", "client.jobs.cancel(handle)")
    async def cancel_async(self, handle: JobHandle) -> bool:
        return await self._jobs.cancel(handle)

    # -- schemas -----------------------------------------------------------

    async def table_schema(self, table: TableRef | str) -> pa.Schema:
        """The table's Arrow schema, as Query's catalog knows it (from the schema cache)."""
        ref = _ref(table)

        async def load() -> pa.Schema:
            body = protocol.encode(protocol.TableRequest(table=ref))
            reply = protocol.decode(
                protocol.DescribeTableResult,
                await self._state.connection.action(protocol.TABLE_SCHEMA, body),
            )
            return schema_from_base64(reply.entry.schema_ipc)

        return await self._state.schemas.get(ref, load)

    # -- tables ------------------------------------------------------------

    async def create_table(self, table: TableRef | str, schema: pa.Schema) -> TableInfo:
        """Create ``table`` (``namespace.table``) with this Arrow schema, through Query.

        Needs an admin principal (Query relays the call to Metasrv with this
        client's token). ``TableExists`` if it exists; FILE columns are
        :func:`lake_core.filetype.file_field` fields.
        """
        ref = _ref(table)
        body = create_body(ref, table_schema_of(schema))
        reply = await self._state.connection.action(protocol.CREATE_TABLE, body)
        self._state.schemas.invalidate(ref)
        return table_info(protocol.decode(protocol.DescribeTableResult, reply).entry)

    async def list_tables(self) -> list[TableInfo]:
        """Every table this client may see, by namespace then name, from Query's catalog."""
        body = protocol.encode(protocol.ListTablesRequest())
        reply = await self._state.connection.action(protocol.LIST_TABLES, body)
        return [table_info(e) for e in protocol.decode(protocol.ListTablesResult, reply).tables]

    async def describe_table(self, table: TableRef | str) -> TableInfo:
        """``table``'s current version and schema (``TableNotFound``; a hidden table is
        ``PermissionDenied`` whether or not it exists)."""
        body = protocol.encode(protocol.TableRequest(table=_ref(table)))
        reply = await self._state.connection.action(protocol.TABLE_SCHEMA, body)
        return table_info(protocol.decode(protocol.DescribeTableResult, reply).entry)

    async def drop_table(self, table: TableRef | str) -> int:
        """Drop ``table`` through Query (admin); returns the version it had when dropped."""
        ref = _ref(table)
        body = protocol.encode(protocol.TableRequest(table=ref))
        reply = await self._state.connection.action(protocol.DROP_TABLE, body)
        self._state.schemas.invalidate(ref)
        return protocol.decode(protocol.DropTableResult, reply).dropped_version

    def invalidate_table_schema(self, table: TableRef | str) -> None:
        """Forget one cached schema (e.g. after the table was replaced)."""
        self._state.schemas.invalidate(_ref(table))

    def clear_schema_cache(self) -> None:
        """Forget every cached table schema."""
        self._state.schemas.clear()

    # -- appends -----------------------------------------------------------

    async def append_batches(
        self,
        table: TableRef | str,
        batches: Iterable[pa.RecordBatch] | pa.Table,
        *,
        operation_id: str | None = None,
    ) -> int:
        """Append exact-schema batches as one new table version and return it.

        Retries an ambiguous transport failure with the same operation id, so
        the append commits at most once.
        """
        ref = _ref(table)
        items = batch_list(batches)
        schema = await self.table_schema(ref)
        items = validate_append(ref, schema, items)
        return await self._state.appender.append(
            ref, schema, items, operation_id or new_operation_id()
        )

    async def ingest(
        self, table: TableRef | str, data: Any, *, operation_id: str | None = None
    ) -> int:
        """Append any number of rows as ONE new table version (bulk ingest); return it.

        ``data``: a pyarrow Table, RecordBatch or RecordBatchReader, or a pandas
        or polars DataFrame, in the table's exact schema (string columns in
        polars' ``large_string`` layout are cast to the table's). It is streamed (never
        held whole) through Query to Metasrv, which commits it once: a failure
        leaves no rows. Past :meth:`append_batches`' 10,000 rows, use this
        (``docs/ingest.md``). Not retried: a reader cannot be replayed; an
        ``operation_id`` makes a retry of yours commit at most once.
        """
        ref = _ref(table)
        reader = as_reader(data, await self.table_schema(ref))
        descriptor = ingest_descriptor(ref, operation_id or new_operation_id(), _any)
        result = await self._state.connection.ingest(descriptor, reader)
        return result.version

    async def insert(
        self, sql: str, params: Sequence[Any], *, progress: ProgressCallback | bool | None = None
    ) -> int:
        """``INSERT INTO ns.table (cols) VALUES (?, ...)`` with one row; returns the version."""
        return await self.insert_many(sql, [params], progress=progress)

    async def insert_many(
        self,
        sql: str,
        rows: Sequence[Sequence[Any]],
        *,
        progress: ProgressCallback | bool | None = None,
    ) -> int:
        """Insert 1..=10,000 rows as one append and one table version.

        ``FileUpload`` parameters stream straight to the managed stage first;
        only their DataLocations enter the batch. Every row is validated before
        the first upload.
        """
        return await insert_rows(
            sql,
            rows,
            schema_of=self.table_schema,
            files=self._state.files,
            appender=self._state.appender,
            progress=progress,
        )

    async def pending_append_ids(self) -> list[str]:
        """Operation ids of appends whose outcome a crash left unknown (at most 1,024)."""
        return await self._state.appender.pending_ids()

    async def resume_pending_append(self, operation_id: str) -> int:
        """Replay one pending append with its own operation id; returns the committed version.

        Commits at most once: if the first attempt committed, the server returns
        that version. A conclusive rejection (including an expired operation)
        removes the pending file and raises.
        """
        return await self._state.appender.resume(operation_id)

    # -- recordings (lake-sdk[mcap]) ------------------------------------------

    async def add_recording(
        self,
        table: TableRef | str,
        path: str | os.PathLike[str],
        *,
        values: Mapping[str, Any] | None = None,
        progress: ProgressCallback | bool | None = None,
    ) -> AddedRecording:
        """Add one MCAP recording to a recordings table (:mod:`lake_sdk.recordings`).

        The file is checked and summarized first (a file that is not a complete
        MCAP file raises ``InvalidRecording`` before any upload), then uploaded
        directly to the stage and one row appended with ``values`` for the
        table's own columns. Returns the version and the summary.
        """
        from lake_sdk.recordings import add_recording

        return await add_recording(self, table, path, values=values, progress=progress)

    # -- FILE values -------------------------------------------------------

    async def object_store(self) -> ManagedObjectStore:
        """This client's managed store (discovered through Query once, shared by clones)."""
        return await self._state.files.store()

    async def cancel_upload(self, path: str | os.PathLike[str]) -> bool:
        """Abort the checkpointed upload of ``path`` (and delete its checkpoint)."""
        directory = self._state.files.options.upload_checkpoint_dir
        if directory is None:
            return False
        return await (await self.object_store()).cancel_upload(path, directory)

    async def open(self, location: DataLocation | Mapping[str, Any]) -> AsyncObjectReader:
        """Stream an object directly from storage; EOF proves its size and SHA-256.

        ``location`` may also be a FILE cell of a DataFrame (``to_pandas``/``to_polars``).
        """
        return await self._state.files.open(as_location(location))

    async def open_range(self, location: DataLocation, start: int, end: int) -> AsyncObjectReader:
        """Exactly bytes ``start..end`` (half-open) of an object, directly from storage."""
        return await self._state.files.open_range(location, start, end)

    async def open_file(
        self,
        location: DataLocation,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        read_ahead: int | None = None,
        ttl: float | timedelta = DEFAULT_FILE_TTL_S,
    ) -> ObjectFile:
        """A seekable, read-only binary file (``io.BufferedIOBase``) over exact range reads.

        Misses fetch whole ``block_size`` blocks (1 MiB), sequential reads also
        fetch up to ``read_ahead`` (8 MiB, or half the cache) beyond, and at most ``cache_bytes``
        (32 MiB; 64 MiB at most) stay cached. Reading it in order to EOF proves
        size and SHA-256. A query-only client reads through capabilities of
        ``ttl`` seconds that it renews before they expire. The file blocks: use
        it from a thread other than this event loop's (``asyncio.to_thread``).
        """
        limits = CacheLimits.create(
            block_size=block_size, cache_bytes=cache_bytes, read_ahead=read_ahead
        )
        fetcher = await self._state.files.range_fetcher(location, ttl)
        state = self._state
        return ObjectFile(
            location,
            fetcher,
            asyncio.get_running_loop(),
            limits,
            client_closed=lambda: state.closed,
        )

    async def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        """A presigned GET (1 s..=1 h) signed with this process's credentials (S3 only)."""
        return await self._state.files.presign_read(location, ttl)

    async def open_via_query(
        self, location: DataLocation, ttl: float | timedelta
    ) -> AsyncObjectReader:
        """Read through a capability Query signs (needs no storage credentials here)."""
        return await self._state.files.open_via_query(location, ttl)

    async def open_range_via_query(
        self, location: DataLocation, start: int, end: int, ttl: float | timedelta
    ) -> AsyncObjectReader:
        """Bytes ``start..end`` through a capability Query signs for exactly that range."""
        return await self._state.files.open_range_via_query(location, start, end, ttl)

    async def presign_read_via_query(
        self, location: DataLocation, ttl: float | timedelta
    ) -> ReadCapability:
        """The capability itself: a bearer URL and headers; never log them."""
        return await self._state.files.presign_read_via_query(location, ttl)


class LakeClient(AsyncClient):
    """Deprecated: the 0.1 name of :class:`AsyncClient`, with its ``connect`` class methods."""

    @classmethod
    @deprecated("LakeClient.connect(url, ...)", "async with lake_sdk.AsyncClient(url, ...)")
    async def connect(cls, url: str, **kwargs: Any) -> LakeClient:
        return await cls._connect(url, **kwargs)

    @classmethod
    @deprecated("LakeClient.connect_query_only(url)", "AsyncClient(url, query_only=True)")
    async def connect_query_only(cls, url: str, **kwargs: Any) -> LakeClient:
        return await cls._connect(url, query_only=True, **kwargs)

    @classmethod
    @deprecated("LakeClient.connect_with_store(url, store)", "AsyncClient(url, store=store)")
    async def connect_with_store(
        cls, url: str, store: ManagedObjectStore, **kwargs: Any
    ) -> LakeClient:
        return await cls._connect(url, store=store, **kwargs)

    @classmethod
    @deprecated("LakeClient.builder(url)", "lake_sdk.AsyncClient(url, token=..., ca_pem=...)")
    def builder(cls, url: str) -> LakeClientBuilder:
        return LakeClientBuilder(url, connect=cls._connect)

    @classmethod
    async def _connect(cls, url: str, **old_kwargs: Any) -> LakeClient:
        client = cls(url, **connect_kwargs(old_kwargs))
        await client.__aenter__()
        return client
