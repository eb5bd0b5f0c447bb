"""Lake Query's Flight SQL service.

Statements and prepared statements are planned at GetFlightInfo (and
CreatePreparedStatement): every referenced table is authorized and pinned,
and the pinned set is sealed into the ticket together with the SQL. DoGet
opens the ticket (it is bound to the caller, the fleet's audience and an
expiry) and runs the query from the ticket alone, on any replica sharing
the key ring. Prepared-statement handles are sealed too: they hold the SQL
and any bound parameters, so no replica keeps statement state.

Catalog discovery (GetCatalogs, GetDbSchemas, GetTables, GetTableTypes) and
GetSqlInfo are answered from memory. Updates of any kind get the one
:class:`ReadOnlySql` error. Lake's own append DoPut (a JSON
``AppendCommand`` descriptor) is authorized here and forwarded unchanged to
Metasrv; the SDK never talks to Metasrv itself.

Wire details that clients depend on: Flight SQL commands in descriptors,
``CreatePreparedStatement``/``ClosePreparedStatement`` bodies and the
``ActionCreatePreparedStatementResult`` are ``google.protobuf.Any``;
``CancelFlightInfo`` and ``CloseSession`` bodies and results, and the
``DoPutPreparedStatementResult`` in ``PutResult.app_metadata``, are raw.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar, cast

import pyarrow as pa
import structlog
from google.protobuf import any_pb2  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.message import (  # type: ignore[import-untyped, unused-ignore]
    DecodeError,
    Message,
)
from pydantic import ValidationError

from lake_core import protocol
from lake_core.errors import (
    InvalidArgument,
    PermissionDenied,
    ReadOnlySql,
    TableNotFound,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from lake_core.filetype import is_file_field
from lake_core.flight.encoding import FlightDataDecoder, InvalidFlightData, encode_stream
from lake_core.flight.server import Context, FlightHandler, current_principal
from lake_core.models import CatalogEntry
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_core.schemas import schema_to_ipc
from lake_core.tickets import TicketSealer
from lake_objects import descriptor as stage_wire
from lake_query import metadata
from lake_query.admission import Admission
from lake_query.catalog_cache import CatalogCache
from lake_query.planning import PlannedQuery, Planner, QuerySpec
from lake_query.results import prefetch
from lake_query.sqlinfo import SQL_INFO_SCHEMA, sql_info_batch
from lake_query.stage import QueryStage

__all__ = ["MAX_SQL_BYTES", "AppendSink", "QueryHandler"]

log = structlog.get_logger("lake_query.flightsql")

#: Longest SQL text accepted, in UTF-8 bytes.
MAX_SQL_BYTES = 1024 * 1024
#: DoGet streams producing at once (more wait for a producer thread).
MAX_STREAMS = 64
#: Longest wait for a catalog refresh on a planning miss or after an append.
REFRESH_TIMEOUT_S = 10.0

_TYPE_PREFIX = "type.googleapis.com/"
_READ_ONLY_COMMANDS = (
    sql_pb.CommandStatementUpdate,
    sql_pb.CommandPreparedStatementUpdate,
    sql_pb.CommandStatementIngest,
)
_COMMANDS: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        sql_pb.CommandStatementQuery,
        sql_pb.CommandPreparedStatementQuery,
        sql_pb.CommandGetSqlInfo,
        sql_pb.CommandGetCatalogs,
        sql_pb.CommandGetDbSchemas,
        sql_pb.CommandGetTables,
        sql_pb.CommandGetTableTypes,
        sql_pb.CommandGetXdbcTypeInfo,
        sql_pb.CommandGetPrimaryKeys,
        sql_pb.CommandGetExportedKeys,
        sql_pb.CommandGetImportedKeys,
        sql_pb.CommandGetCrossReference,
        sql_pb.CommandStatementSubstraitPlan,
        *_READ_ONLY_COMMANDS,
    )
}
_METADATA_COMMANDS = (
    sql_pb.CommandGetSqlInfo,
    sql_pb.CommandGetCatalogs,
    sql_pb.CommandGetDbSchemas,
    sql_pb.CommandGetTables,
    sql_pb.CommandGetTableTypes,
)

# Action names.
CREATE_PREPARED_STATEMENT = "CreatePreparedStatement"
CLOSE_PREPARED_STATEMENT = "ClosePreparedStatement"
CLOSE_SESSION = "CloseSession"
CANCEL_FLIGHT_INFO = "CancelFlightInfo"
_ACTIONS = {
    CREATE_PREPARED_STATEMENT: "Plan a SQL query; returns a stateless sealed handle",
    CLOSE_PREPARED_STATEMENT: "Release a prepared statement (no server state)",
    CLOSE_SESSION: "End a Flight SQL session (no server state)",
    CANCEL_FLIGHT_INFO: "Cancel a statement (nothing runs before DoGet)",
    protocol.TABLE_SCHEMA: "Lake: a table's current schema and version from the catalog cache",
    stage_wire.MANAGED_STAGE: "Lake: the caller's credential-free managed stage descriptor",
    stage_wire.READ_CAPABILITY: "Lake: a bounded read capability for one DataLocation (S3 only)",
}

# Ticket and handle body kinds.
_QUERY = "q"
_METADATA = "m"
_PREPARED = "p"

M = TypeVar("M", bound=Message)
T = TypeVar("T")


class AppendSink(Protocol):
    """Where appends go (``lake_core.metaclient.MetaClient`` in production)."""

    async def append_messages(
        self, messages: AsyncIterator[pb.FlightData], *, on_behalf_of: Principal | None = None
    ) -> protocol.AppendResult: ...


def _pack(message: Message) -> bytes:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return bytes(wrapper.SerializeToString())


def _unpack_any(data: bytes, what: str) -> Message:
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        raise InvalidArgument(f"{what} is not a Flight SQL command") from None
    name = wrapper.type_url.removeprefix(_TYPE_PREFIX)
    cls = _COMMANDS.get(name)
    if cls is None:
        raise InvalidArgument(f"{what} carries an unknown command {name[:200]!r}")
    message = cls()
    if not wrapper.Unpack(message):
        raise InvalidArgument(f"{what} carries a malformed {name}")
    return message


def _unpack_as(data: bytes, cls: type[M], what: str) -> M:
    wrapper = any_pb2.Any()
    message = cls()
    try:
        wrapper.ParseFromString(data)
        ok = wrapper.Unpack(message)
    except DecodeError:
        ok = False
    if not ok:
        raise InvalidArgument(f"{what} must be an Any-wrapped {cls.DESCRIPTOR.full_name}")
    return cast(M, message)


def _parse_raw(data: bytes, cls: type[M], what: str) -> M:
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise InvalidArgument(f"{what} must be a {cls.DESCRIPTOR.full_name}") from None
    return cast(M, message)


def _check_sql(sql: str, limit: int = MAX_SQL_BYTES) -> str:
    if len(sql.encode()) > limit:
        raise InvalidArgument(f"SQL text exceeds {limit} bytes")
    if not sql.strip():
        raise InvalidArgument("SQL text is empty")
    return sql


def _no_transaction(command: Message) -> None:
    if command.HasField("transaction_id"):
        raise Unimplemented("Lake SQL has no transactions")


def _principal() -> Principal:
    principal = current_principal()
    if not isinstance(principal, Principal):
        raise Unauthenticated("authentication required")
    return principal


class QueryHandler(FlightHandler):
    """The Flight SQL handler of one Query replica."""

    def __init__(
        self,
        *,
        cache: CatalogCache,
        sealer: TicketSealer,
        handle_sealer: TicketSealer,
        appends: AppendSink | None = None,
        executor: ThreadPoolExecutor | None = None,
        admission: Admission | None = None,
        max_sql_bytes: int = MAX_SQL_BYTES,
        stage: QueryStage | None = None,
    ) -> None:
        self._stage = stage or QueryStage(None)
        self._admission = admission
        self._max_sql_bytes = max_sql_bytes
        self._cache = cache
        self._sealer = sealer
        self._handles = handle_sealer
        self._appends = appends
        self._executor = executor or ThreadPoolExecutor(
            max_workers=max(8, 4 * (os.cpu_count() or 2)), thread_name_prefix="lake-plan"
        )
        # One producer thread per running DoGet, apart from planning's pool so
        # long streams cannot starve planning.
        self._streams = ThreadPoolExecutor(
            max_workers=MAX_STREAMS, thread_name_prefix="lake-stream"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.planner = Planner(self._resolve, cache.table_refs)

    def __repr__(self) -> str:
        return f"QueryHandler({self._cache!r})"

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._streams.shutdown(wait=False, cancel_futures=True)

    # Threads.

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        self._loop = asyncio.get_running_loop()
        return await self._loop.run_in_executor(self._executor, fn, *args)

    def _resolve(self, table: TableRef) -> CatalogEntry | None:
        """Planning's table lookup (worker thread): the cache, refreshed once on a miss."""
        entry = self._cache.entry(table)
        if entry is not None or self._loop is None:
            return entry
        refresh = asyncio.run_coroutine_threadsafe(self._cache.refresh(), self._loop)
        try:
            refresh.result(REFRESH_TIMEOUT_S)
        except Exception as exc:
            refresh.cancel()
            raise Unavailable(
                f"{table.qualified} is not in the catalog cache and the catalog could not "
                f"be refreshed: {exc}"
            ) from None
        return self._cache.entry(table)

    # Planning.

    def _check_ticket(self, data: bytes, what: str) -> bytes:
        # Tickets and handles carry SQL: the SQL size limit bounds them too.
        if len(data) > self._max_sql_bytes:
            raise InvalidArgument(f"{what} exceeds {self._max_sql_bytes} bytes")
        return data

    async def _plan(self, spec: QuerySpec, principal: Principal) -> PlannedQuery:
        _check_sql(spec.sql, self._max_sql_bytes)
        planned = await self._blocking(self.planner.plan_spec, spec, principal)
        log.info(
            "query planned",
            principal=principal.principal_id,
            tables=[str(p.table) for p in planned.spec.pins],
        )
        return planned

    def _open_handle(self, handle: bytes, principal: Principal) -> QuerySpec:
        body = self._handles.open(self._check_ticket(handle, "the statement handle"), principal)
        if body.get("k") != _PREPARED or not isinstance(body.get("sql"), str):
            raise InvalidArgument("not a Lake prepared statement handle")
        params = body.get("params")
        return QuerySpec(sql=body["sql"], params_ipc=params if isinstance(params, str) else None)

    def _seal_handle(self, spec: QuerySpec, principal: Principal) -> bytes:
        return self._handles.seal(
            principal, {"k": _PREPARED, "sql": spec.sql, "params": spec.params_ipc}
        )

    async def _describe(
        self, descriptor: pb.FlightDescriptor, principal: Principal
    ) -> tuple[pa.Schema, dict[str, Any]]:
        """The result schema of a descriptor and the ticket body that produces it."""
        if descriptor.type != pb.FlightDescriptor.CMD:
            raise InvalidArgument("Lake Query answers Flight SQL commands (CMD descriptors)")
        command = _unpack_any(descriptor.cmd, "the descriptor")
        if isinstance(command, sql_pb.CommandStatementQuery):
            _no_transaction(command)
            planned = await self._plan(QuerySpec(sql=command.query), principal)
        elif isinstance(command, sql_pb.CommandPreparedStatementQuery):
            spec = self._open_handle(command.prepared_statement_handle, principal)
            planned = await self._plan(spec, principal)
        elif isinstance(command, _METADATA_COMMANDS):
            schema = _metadata_schema(command)
            return schema, {"k": _METADATA, "c": base64.b64encode(descriptor.cmd).decode()}
        elif isinstance(command, _READ_ONLY_COMMANDS):
            raise ReadOnlySql()
        else:
            raise Unimplemented(f"{command.DESCRIPTOR.name} is not supported by Lake Query")
        return planned.schema, {"k": _QUERY, "q": planned.spec.model_dump(mode="json")}

    # Flight RPCs.

    async def get_flight_info(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.FlightInfo:
        principal = _principal()
        schema, body = await self._describe(descriptor, principal)
        ticket = self._sealer.seal(principal, body)
        return pb.FlightInfo(
            schema=schema_to_ipc(schema),
            flight_descriptor=descriptor,
            endpoint=[pb.FlightEndpoint(ticket=pb.Ticket(ticket=ticket))],
            total_records=-1,
            total_bytes=-1,
        )

    async def poll_flight_info(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.PollInfo:
        # Planning is synchronous, so the first poll is already complete
        # (no flight_descriptor to poll again).
        info = await self.get_flight_info(descriptor, context)
        return pb.PollInfo(info=info, progress=1.0)

    async def get_schema(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.SchemaResult:
        schema, _ = await self._describe(descriptor, _principal())
        return pb.SchemaResult(schema=schema_to_ipc(schema))

    async def do_get(self, ticket: pb.Ticket, context: Context) -> AsyncIterator[bytes]:
        principal = _principal()
        body = self._sealer.open(self._check_ticket(ticket.ticket, "the ticket"), principal)
        kind = body.get("k")
        messages: AsyncIterator[bytes]
        if kind == _QUERY:
            try:
                spec = QuerySpec.model_validate(body.get("q"))
            except ValidationError:
                # Authentic, so sealed by a replica of another Lake version.
                raise InvalidArgument("ticket from an incompatible Lake Query version") from None

            def produce() -> Iterator[bytes]:
                # Opening the pinned tables and producing their messages run on
                # one stream thread, with no hop back to the loop in between.
                stream = self.planner.execute(spec, principal)
                yield from encode_stream(stream.schema, stream)

            async def start() -> AsyncIterator[bytes]:
                return prefetch(produce(), self._streams)

            if self._admission is None:
                messages = await start()
            else:
                # The permit is held for the whole stream (lake_query.admission).
                messages = self._admission.run(principal.tenant_id, context, start)
        elif kind == _METADATA:
            command = _unpack_any(base64.b64decode(body.get("c", "")), "the ticket")
            batch = self._metadata_batch(command, principal)
            messages = prefetch(encode_stream(batch.schema, [batch]), self._streams)
        else:
            raise Unauthenticated("invalid ticket")
        sent = 0
        async with contextlib.aclosing(messages):
            async for message in messages:
                sent += 1
                yield message
        log.debug("stream finished", messages=sent)

    def _metadata_batch(self, command: Message, principal: Principal) -> pa.RecordBatch:
        if isinstance(command, sql_pb.CommandGetSqlInfo):
            return sql_info_batch(list(command.info))
        if isinstance(command, sql_pb.CommandGetCatalogs):
            return metadata.catalogs_batch()
        if isinstance(command, sql_pb.CommandGetDbSchemas):
            return metadata.db_schemas_batch(
                self._cache,
                principal,
                command.catalog if command.HasField("catalog") else None,
                command.db_schema_filter_pattern
                if command.HasField("db_schema_filter_pattern")
                else None,
            )
        if isinstance(command, sql_pb.CommandGetTables):
            return metadata.tables_batch(
                self._cache,
                principal,
                command.catalog if command.HasField("catalog") else None,
                command.db_schema_filter_pattern
                if command.HasField("db_schema_filter_pattern")
                else None,
                command.table_name_filter_pattern
                if command.HasField("table_name_filter_pattern")
                else None,
                list(command.table_types),
                command.include_schema,
            )
        if isinstance(command, sql_pb.CommandGetTableTypes):
            return metadata.table_types_batch()
        raise InvalidArgument("invalid ticket")

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Context
    ) -> AsyncIterator[pb.PutResult]:
        principal = _principal()
        first = await anext(messages, None)
        if first is None or not first.HasField("flight_descriptor"):
            raise InvalidArgument("DoPut needs a descriptor on its first message")
        cmd = first.flight_descriptor.cmd
        if cmd.lstrip().startswith(b"{"):
            yield await self._append(cmd, first, messages, principal)
            return
        command = _unpack_any(cmd, "the DoPut descriptor")
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            yield await self._bind(command, first, messages, principal)
        elif isinstance(command, _READ_ONLY_COMMANDS):
            raise ReadOnlySql()
        else:
            raise Unimplemented(f"DoPut of {command.DESCRIPTOR.name} is not supported")

    async def _bind(
        self,
        command: sql_pb.CommandPreparedStatementQuery,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
    ) -> pb.PutResult:
        """Bind parameters: a new sealed handle carrying SQL and values."""
        spec = self._open_handle(command.prepared_statement_handle, principal)
        decoder = FlightDataDecoder(max_bytes=4 * 1024 * 1024, too_large=InvalidArgument)
        batches: list[pa.RecordBatch] = []
        try:
            batches += decoder.feed(first)
            async for message in messages:
                batches += decoder.feed(message)
        except InvalidFlightData as exc:
            raise InvalidArgument(f"invalid parameter data: {exc}") from None
        params = None
        if decoder.schema is not None and decoder.schema.names:
            table = pa.Table.from_batches(batches, schema=decoder.schema)
            if table.num_rows:
                params = table.combine_chunks().to_batches()[0]
        bound = QuerySpec(sql=spec.sql, params_ipc=QuerySpec.encode_parameters(params))
        result = sql_pb.DoPutPreparedStatementResult(
            prepared_statement_handle=self._seal_handle(bound, principal)
        )
        return pb.PutResult(app_metadata=result.SerializeToString())

    async def _append(
        self,
        cmd: bytes,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
    ) -> pb.PutResult:
        command = protocol.decode(protocol.AppendCommand, cmd)
        if not principal.may_see(command.table.namespace):
            raise PermissionDenied(f"permission denied: {command.table.qualified}")
        if self._appends is None:
            raise Unimplemented("this Query replica does not accept appends")
        if self._cache.entry(command.table) is None:
            await self._refresh_quietly()
            if self._cache.entry(command.table) is None:
                raise TableNotFound(command.table.qualified)

        checked = await self._check_file_cells(command.table, first, messages, principal)

        async def forward() -> AsyncIterator[pb.FlightData]:
            if checked is not None:
                for message in checked:
                    yield message
                return
            yield first
            async for message in messages:
                yield message

        # Metasrv authorizes the append again, as this principal (lake_core.auth).
        result = await self._appends.append_messages(forward(), on_behalf_of=principal)
        log.info(
            "append forwarded",
            table=str(result.table),
            version=result.version,
            replayed=result.replayed,
        )
        # Refresh before replying so this replica reads its own writes.
        await self._refresh_quietly()
        return pb.PutResult(app_metadata=protocol.encode(result))

    async def _check_file_cells(
        self,
        table: TableRef,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
    ) -> list[pb.FlightData] | None:
        """For a table with FILE columns: the whole append, after its FILE cells passed the
        tenant-prefix check (None for other tables, which stream straight through)."""
        cached = self._cache.lookup(table)
        schema = cached.schema if cached is not None else None
        if schema is None or not any(is_file_field(f) for f in schema):
            return None
        decoder = FlightDataDecoder(max_bytes=protocol.MAX_APPEND_BYTES, too_large=InvalidArgument)
        kept = [first]
        try:
            batches = decoder.feed(first)
            async for message in messages:
                kept.append(message)
                batches += decoder.feed(message)
        except InvalidFlightData as exc:
            raise InvalidArgument(f"invalid append data: {exc}") from None
        self._stage.check_append(principal, schema, batches)
        return kept

    async def _stage_action(self, kind: str, body: bytes, principal: Principal) -> bytes:
        if kind == stage_wire.MANAGED_STAGE:
            protocol.decode(stage_wire.StageRequest, body)
            return protocol.encode(self._stage.descriptor(principal))
        request = protocol.decode(stage_wire.ReadCapabilityRequest, body)
        return protocol.encode(await self._stage.read_capability(principal, request))

    async def _refresh_quietly(self) -> None:
        try:
            await asyncio.wait_for(self._cache.refresh(), REFRESH_TIMEOUT_S)
        except Exception as exc:
            log.warning("catalog refresh failed", error=str(exc))
            self._cache.refresh_soon()

    async def do_action(self, action: pb.Action, context: Context) -> AsyncIterator[pb.Result]:
        principal = _principal()
        kind = action.type
        if kind == CREATE_PREPARED_STATEMENT:
            request = _unpack_as(
                action.body, sql_pb.ActionCreatePreparedStatementRequest, "the action body"
            )
            _no_transaction(request)
            planned = await self._plan(QuerySpec(sql=request.query), principal)
            result = sql_pb.ActionCreatePreparedStatementResult(
                prepared_statement_handle=self._seal_handle(planned.spec, principal),
                dataset_schema=schema_to_ipc(planned.schema),
            )
            yield pb.Result(body=_pack(result))
        elif kind == CLOSE_PREPARED_STATEMENT:
            _unpack_as(action.body, sql_pb.ActionClosePreparedStatementRequest, "the action body")
        elif kind == CLOSE_SESSION:
            closed = pb.CloseSessionResult(status=pb.CloseSessionResult.CLOSED)
            yield pb.Result(body=closed.SerializeToString())
        elif kind == CANCEL_FLIGHT_INFO:
            _parse_raw(action.body, pb.CancelFlightInfoRequest, "the action body")
            # Nothing runs before DoGet, and a DoGet is cancelled by its client.
            cancelled = pb.CancelFlightInfoResult(status=pb.CANCEL_STATUS_CANCELLED)
            yield pb.Result(body=cancelled.SerializeToString())
        elif kind == protocol.TABLE_SCHEMA:
            yield pb.Result(body=await self._table_schema(action.body, principal))
        elif kind in (stage_wire.MANAGED_STAGE, stage_wire.READ_CAPABILITY):
            yield pb.Result(body=await self._stage_action(kind, bytes(action.body), principal))
        else:
            raise Unimplemented(f"action {kind[:100]!r} is not supported by Lake Query")

    async def _table_schema(self, body: bytes, principal: Principal) -> bytes:
        table = protocol.decode(protocol.TableRequest, body).table
        if not principal.may_see(table.namespace):
            raise PermissionDenied(f"permission denied: {table.qualified}")
        cached = self._cache.lookup(table)
        if cached is None:
            await self._refresh_quietly()
            cached = self._cache.lookup(table)
        if cached is None:
            raise TableNotFound(table.qualified)
        cached.schema_ipc()  # fail explicitly for a registration without a schema
        return protocol.encode(protocol.DescribeTableResult(entry=cached.entry))

    async def list_actions(self, context: Context) -> AsyncIterator[pb.ActionType]:
        for name, description in _ACTIONS.items():
            yield pb.ActionType(type=name, description=description)


def _metadata_schema(command: Message) -> pa.Schema:
    if isinstance(command, sql_pb.CommandGetSqlInfo):
        return SQL_INFO_SCHEMA
    if isinstance(command, sql_pb.CommandGetCatalogs):
        return metadata.CATALOGS_SCHEMA
    if isinstance(command, sql_pb.CommandGetDbSchemas):
        return metadata.DB_SCHEMAS_SCHEMA
    if isinstance(command, sql_pb.CommandGetTables):
        return (
            metadata.TABLES_WITH_SCHEMA_SCHEMA if command.include_schema else metadata.TABLES_SCHEMA
        )
    return metadata.TABLE_TYPES_SCHEMA
