"""The async Lake client: SQL over Flight SQL, appends through Query, FILE values.

The client talks to one Query endpoint only; Query forwards appends to the
commit authority. FILE bytes go directly between this process and the managed
object stage (:mod:`lake_sdk.objects`). Blocking pyarrow Flight calls run on worker threads so the
event loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from lake_core import protocol
from lake_core.errors import InvalidAppend, InvalidArgument, LakeError, Unavailable
from lake_core.ids import new_operation_id
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_core.schemas import check_exact_schema, schema_from_base64
from lake_core.values import check_batches
from lake_objects.progress import ProgressCallback
from lake_objects.s3 import DEFAULT_UPLOAD_CONCURRENCY
from lake_objects.store import ManagedObjectStore
from lake_sdk._errors import Trailers, calling, lake_error
from lake_sdk.builder import ConnectOptions, LakeClientBuilder
from lake_sdk.files import FileOptions, validate_file_options
from lake_sdk.objects import ClientState, ObjectMethods, new_state
from lake_sdk.schema_cache import DEFAULT_SCHEMA_CACHE_CAPACITY, DEFAULT_SCHEMA_CACHE_TTL_S

__all__ = ["LakeClient", "QueryResult"]

_SCHEMES = ("grpc://", "http://", "grpc+tls://", "https://")
_SQL_TYPE_URL = "type.googleapis.com/arrow.flight.protocol.sql."


def _any(message: Any) -> bytes:
    from google.protobuf import any_pb2

    wrapper = any_pb2.Any()
    wrapper.Pack(message, type_url_prefix="type.googleapis.com/")
    data: bytes = wrapper.SerializeToString()
    return data


def _location(url: str) -> str:
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        raise InvalidArgument(f"Lake endpoint {url!r} must start with one of {', '.join(_SCHEMES)}")
    for plain, flight_scheme in (
        ("http://", "grpc+tcp://"),
        ("grpc://", "grpc+tcp://"),
        ("https://", "grpc+tls://"),
    ):
        if url.startswith(plain):
            return flight_scheme + url[len(plain) :]
    return url


class QueryResult:
    """A stream of record batches; iterate it, or collect it with :meth:`to_table`."""

    def __init__(
        self, reader: flight.FlightStreamReader, schema: pa.Schema, trailers: Trailers
    ) -> None:
        self._reader = reader
        self._trailers = trailers
        self.schema = schema

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[pa.RecordBatch]:
        while True:
            try:
                batch = await asyncio.to_thread(self._next_batch)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, self._trailers) from None
            if batch is None:
                return
            yield batch

    def _next_batch(self) -> pa.RecordBatch | None:
        # StopIteration cannot cross a thread future, so end-of-stream becomes None.
        try:
            return self._reader.read_chunk().data
        except StopIteration:
            return None

    async def to_table(self) -> pa.Table:
        batches = [batch async for batch in self]
        return pa.Table.from_batches(batches, schema=self.schema)

    def cancel(self) -> None:
        self._reader.cancel()


class LakeClient(ObjectMethods):
    """An async connection to a Lake Query endpoint.

    FILE options (see :mod:`lake_sdk.objects`): ``upload_checkpoint_dir`` makes
    path uploads restart-resumable and appends durable; ``upload_concurrency``
    (1..=16 parts in flight, default 4); the schema cache's capacity and TTL.
    :meth:`clone` shares the connection, schema cache and stage.
    """

    def __init__(
        self,
        url: str,
        client: flight.FlightClient,
        *,
        append_attempts: int,
        state: ClientState | None = None,
        files: FileOptions | None = None,
        schema_cache_capacity: int = DEFAULT_SCHEMA_CACHE_CAPACITY,
        schema_cache_ttl_s: float = DEFAULT_SCHEMA_CACHE_TTL_S,
    ) -> None:
        self.url = url
        self._client = client
        self._append_attempts = append_attempts
        self._state = state or new_state(
            files or FileOptions(),
            self._action,
            schema_cache_capacity=schema_cache_capacity,
            schema_cache_ttl_s=schema_cache_ttl_s,
        )

    def clone(self) -> LakeClient:
        """Another handle on this connection, sharing its schema cache and stage."""
        return LakeClient(
            self.url, self._client, append_attempts=self._append_attempts, state=self._state
        )

    def __repr__(self) -> str:
        return f"LakeClient({self.url!r})"

    @classmethod
    def builder(cls, url: str) -> LakeClientBuilder:
        """Configure a connection (bearer token, CA, server name); see :mod:`lake_sdk.builder`."""
        return LakeClientBuilder(url)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        timeout_s: float = 10.0,
        append_attempts: int = 3,
        options: ConnectOptions | None = None,
        upload_checkpoint_dir: str | os.PathLike[str] | None = None,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
        schema_cache_capacity: int = DEFAULT_SCHEMA_CACHE_CAPACITY,
        schema_cache_ttl_s: float = DEFAULT_SCHEMA_CACHE_TTL_S,
        progress: ProgressCallback | None = None,
        query_only: bool = False,
        store: ManagedObjectStore | None = None,
    ) -> LakeClient:
        """Connect to a Query endpoint (``grpc://host:port`` or ``http://host:port``)."""
        if not 1 <= append_attempts <= 10:
            raise InvalidArgument("append_attempts must be in 1..=10")
        files = FileOptions.create(
            upload_checkpoint_dir=upload_checkpoint_dir,
            upload_concurrency=upload_concurrency,
            query_only=query_only,
            store=store,
            progress=progress,
        )
        validate_file_options(files, schema_cache_capacity, schema_cache_ttl_s)
        location = _location(url)
        client = (options or ConnectOptions()).flight_client(url, location)
        error: LakeError | None = None
        with calling() as trailers:
            try:
                await asyncio.to_thread(client.wait_for_available, timeout_s)
            except (flight.FlightError, pa.ArrowException) as exc:
                error = lake_error(exc, trailers)
        if error is not None:
            client.close()
            if isinstance(error, Unavailable):
                raise Unavailable(f"Lake Query at {url} is not reachable: {error}") from None
            raise error from None  # e.g. Unauthenticated: a wrong or missing token
        return cls(
            url,
            client,
            append_attempts=append_attempts,
            files=files,
            schema_cache_capacity=schema_cache_capacity,
            schema_cache_ttl_s=schema_cache_ttl_s,
        )

    @classmethod
    async def connect_query_only(cls, url: str, **kwargs: Any) -> LakeClient:
        """A client with no storage access: FILE reads go through Query-issued capabilities."""
        return await cls.connect(url, query_only=True, **kwargs)

    @classmethod
    async def connect_with_store(
        cls, url: str, store: ManagedObjectStore, **kwargs: Any
    ) -> LakeClient:
        """A client using ``store`` instead of discovering the stage (embedders, tests)."""
        return await cls.connect(url, store=store, **kwargs)

    async def close(self) -> None:
        """Close the connection (shared with clones) and the object store."""
        await self._state.files.close()
        await asyncio.to_thread(self._client.close)

    async def _action(self, name: str, body: bytes) -> bytes:
        """One Lake DoAction and its single result body."""
        results = await self._call(lambda: list(self._client.do_action(flight.Action(name, body))))
        if not results:
            raise LakeError(f"Query sent no result for {name}")
        data: bytes = results[0].body.to_pybytes()
        return data

    async def __aenter__(self) -> LakeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _call(self, fn: Any, *args: Any) -> Any:
        with calling() as trailers:
            try:
                return await asyncio.to_thread(fn, *args)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, trailers) from None

    # -- SQL ---------------------------------------------------------------

    async def query(self, sql: str) -> QueryResult:
        """Run read-only SQL; the result is pinned to the table versions seen at planning."""
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidArgument("SQL must be a non-empty string")
        command = flight_sql_pb2.CommandStatementQuery(query=sql)
        descriptor = flight.FlightDescriptor.for_command(_any(command))
        info: flight.FlightInfo = await self._call(self._client.get_flight_info, descriptor)
        endpoint = info.endpoints[0]
        with calling() as trailers:
            try:
                reader = await asyncio.to_thread(self._client.do_get, endpoint.ticket)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, trailers) from None
        return QueryResult(reader, info.schema, trailers)

    async def query_table(self, sql: str) -> pa.Table:
        """Run SQL and collect the whole result."""
        return await (await self.query(sql)).to_table()

    # -- schemas -----------------------------------------------------------

    async def table_schema(self, table: TableRef | str) -> pa.Schema:
        """The table's Arrow schema, as Query's catalog knows it (from the schema cache)."""
        ref = table if isinstance(table, TableRef) else TableRef.parse(table)

        async def load() -> pa.Schema:
            body = protocol.encode(protocol.TableRequest(table=ref))
            reply = protocol.decode(
                protocol.DescribeTableResult, await self._action(protocol.TABLE_SCHEMA, body)
            )
            return schema_from_base64(reply.entry.schema_ipc)

        return await self._state.schemas.get(ref, load)

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
        ref = table if isinstance(table, TableRef) else TableRef.parse(table)
        items = batches.to_batches() if isinstance(batches, pa.Table) else list(batches)
        schema = await self.table_schema(ref)
        items = _validate_append(ref, schema, items)
        # With an upload checkpoint directory the operation is recorded durably first.
        return await self._durable_append(ref, schema, items, operation_id or new_operation_id())

    async def _append_with_retries(
        self, ref: TableRef, schema: pa.Schema, items: list[pa.RecordBatch], op_id: str
    ) -> int:
        command = protocol.AppendCommand(table=ref, operation_id=op_id)
        descriptor = flight.FlightDescriptor.for_command(protocol.encode(command))
        last: LakeError | None = None
        for attempt in range(self._append_attempts):
            with calling() as trailers:
                try:
                    result = await asyncio.to_thread(self._put, descriptor, schema, items)
                    return result.version
                except (flight.FlightError, pa.ArrowException) as exc:
                    error = lake_error(exc, trailers, commit=True)
                if not error.retryable or isinstance(error, InvalidArgument):
                    if isinstance(error, InvalidArgument):
                        self.invalidate_table_schema(ref)
                    raise error from None
                last = error
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        assert last is not None
        raise last

    def _put(
        self,
        descriptor: flight.FlightDescriptor,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
    ) -> protocol.AppendResult:
        writer, reader = self._client.do_put(descriptor, schema)
        try:
            for batch in batches:
                writer.write_batch(batch)
            writer.done_writing()
            metadata = reader.read()
        finally:
            writer.close()
        if metadata is None:
            raise LakeError("Query acknowledged the append without a result")
        return protocol.decode(protocol.AppendResult, metadata.to_pybytes())


def _validate_append(
    table: TableRef, schema: pa.Schema, batches: Sequence[pa.RecordBatch]
) -> list[pa.RecordBatch]:
    """Check Lake's append bounds locally, before anything is sent."""
    if not batches:
        raise InvalidAppend(f"append to {table} has no batches")
    rows = 0
    encoded = 0
    for i, batch in enumerate(batches):
        if not isinstance(batch, pa.RecordBatch):
            raise InvalidAppend(f"batch {i} is a {type(batch).__name__}, not a pyarrow.RecordBatch")
        if batch.num_rows == 0:
            raise InvalidAppend(f"batch {i} of the append to {table} is empty")
        check_batches(table, schema, [batch], first_row=rows)  # named by row and column
        check_exact_schema(schema, batch.schema, table)
        rows += batch.num_rows
        if rows > protocol.MAX_APPEND_ROWS:
            raise InvalidAppend(
                f"append to {table} has more than {protocol.MAX_APPEND_ROWS:,} rows"
            )
        encoded += pa.ipc.get_record_batch_size(batch)
        if encoded > protocol.MAX_APPEND_BYTES:
            raise InvalidAppend(
                f"append to {table} encodes to more than {protocol.MAX_APPEND_BYTES // 2**20} MiB"
            )
    # Send the table's own schema (FILE markers included) so the server's check is exact.
    return [pa.RecordBatch.from_arrays(batch.columns, schema=schema) for batch in batches]
