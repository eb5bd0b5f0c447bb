"""Lake Query's Flight SQL service: one handler per replica.

Statements and prepared statements are planned at GetFlightInfo (and
CreatePreparedStatement): every referenced table is authorized and pinned,
and the pinned set is sealed into the ticket together with the SQL. DoGet
opens the ticket (it is bound to the caller, the fleet's audience and an
expiry) and runs the query from the ticket alone, on any replica sharing
the key ring. Prepared-statement handles are sealed too
(:mod:`~lake_query.flightsql.statements`).
A plain scan over many fragments gets one endpoint per fragment range
(:mod:`~lake_query.flightsql.endpoints`), each its own sealed ticket.
When the native data plane runs (:mod:`lake_query.dataplane`), each query
and metadata endpoint's ``location`` names it; DoGet here still redeems
every ticket.

Catalog discovery and GetSqlInfo are answered from memory
(:mod:`~lake_query.flightsql.discovery`). Updates of any kind get the one
:class:`ReadOnlySql` error. Lake's own append DoPut is authorized here and
forwarded unchanged to Metasrv (:mod:`~lake_query.flightsql.appends`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import structlog
from pydantic import ValidationError

from lake_core import protocol, status
from lake_core.errors import (
    InvalidArgument,
    ReadOnlySql,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    VersionReclaimed,
)
from lake_core.flight.encoding import encode_stream, has_dictionary
from lake_core.flight.server import Context, FlightHandler
from lake_core.models import CatalogEntry
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_core.schemas import schema_to_ipc
from lake_core.telemetry import series
from lake_core.tickets import TicketSealer
from lake_objects import descriptor as stage_wire
from lake_query.flightsql import discovery, wire
from lake_query.flightsql.appends import Appends, AppendSink
from lake_query.flightsql.discovery import REFRESH_TIMEOUT_S
from lake_query.flightsql.endpoints import PARTITION, fragments_of, query_bodies
from lake_query.flightsql.ingest import Ingests, IngestSink
from lake_query.flightsql.stage import QueryStage
from lake_query.flightsql.statements import PreparedStatements
from lake_query.flightsql.tables import TableChores
from lake_query.flightsql.wire import MAX_SQL_BYTES, caller
from lake_query.jobs.service import PART, AsyncQueries, is_handle
from lake_query.planning import DatasetOpener, PlannedQuery, Planner, QueryLimits, QuerySpec
from lake_query.planning.batches import counted_rows, prefetch
from lake_query.planning.catalog import WalkStart
from lake_query.planning.catalog_cache import CatalogCache
from lake_query.planning.external import ExternalCatalog
from lake_query.planning.freshness import MAX_REPLANS, catch_up, min_versions
from lake_query.planning.partitions import PartitionLimits
from lake_query.planning.planner import ResultStream
from lake_query.planning.scan_cache import ScanCache
from lake_query.serving.admission import Admission, replica_status
from lake_query.serving.planning_threads import PlanningThreads
from lake_query.serving.readiness import Readiness

__all__ = ["MAX_STREAMS", "QueryHandler"]

log = structlog.get_logger("lake_query.flightsql")

#: DoGet streams producing at once (more wait for a producer thread).
MAX_STREAMS = 64

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
    protocol.LIST_TABLES: "Lake: every table the caller may see, from the catalog cache",
    protocol.CREATE_TABLE: "Lake admin: create a table (relayed to Metasrv as the caller)",
    protocol.DROP_TABLE: "Lake admin: drop a table (relayed to Metasrv as the caller)",
    stage_wire.MANAGED_STAGE: "Lake: the caller's credential-free managed stage descriptor",
    stage_wire.READ_CAPABILITY: "Lake: a bounded read capability for one DataLocation (S3 only)",
    status.STATUS: "Lake admin: this replica's health, admission, catalog view, memory and "
    "version -> QueryStatus",
}

T = TypeVar("T")


def _poll_wait_s(header: str | None) -> float:
    """Seconds a poll may be held (``lake-async-wait-ms``); 0 for none, InvalidArgument if bad."""
    if header is None:
        return 0.0
    if not (header.isascii() and header.isdigit()) or len(header) > 9:
        raise InvalidArgument(f"{protocol.ASYNC_WAIT_HEADER} must be whole milliseconds")
    return min(int(header), protocol.ASYNC_MAX_POLL_WAIT_MS) / 1000


class QueryHandler(FlightHandler):
    """The Flight SQL handler of one Query replica.

    ``datasets`` is how this replica opens pinned versions (its storage
    settings and its cache of opened datasets); by default local paths.
    ``limits`` bounds each statement (:mod:`lake_query.planning.limits`).
    ``scans`` keeps recent direct scans for repeated DoGets (:mod:`lake_query.planning.scan_cache`).
    """

    def __init__(
        self,
        *,
        cache: CatalogCache,
        sealer: TicketSealer,
        handle_sealer: TicketSealer,
        appends: AppendSink | None = None,
        planning: PlanningThreads | None = None,
        admission: Admission | None = None,
        max_sql_bytes: int = MAX_SQL_BYTES,
        stage: QueryStage | None = None,
        datasets: DatasetOpener | None = None,
        limits: QueryLimits | None = None,
        partitions: PartitionLimits | None = None,
        external: Iterable[ExternalCatalog] = (),
        async_queries: Callable[[QueryHandler], AsyncQueries] | None = None,
        readiness: Readiness | None = None,
        scans: ScanCache | None = None,
        walk_start: WalkStart | None = None,
    ) -> None:
        self._stage = stage or QueryStage(None)
        #: Why this replica does not serve statements now (none: it does).
        self.readiness = readiness or Readiness()
        self._admission = admission
        self._max_sql_bytes = max_sql_bytes
        self._cache = cache
        self._sealer = sealer
        self._statements = PreparedStatements(handle_sealer, max_sql_bytes)
        self._appends = Appends(cache, appends, self._stage)
        #: Planning's threads, deadline and per-tenant budget (lake_query.serving.planning_threads).
        self.planning = planning or PlanningThreads()
        # The same sink takes bulk ingests (lake_core.metaclient.MetaClient has both).
        self._ingests = Ingests(cache, appends if isinstance(appends, IngestSink) else None)
        self._tables = TableChores(cache, appends)
        # One producer thread per running DoGet, apart from planning's pool so
        # long streams cannot starve planning.
        self._streams = ThreadPoolExecutor(
            max_workers=MAX_STREAMS, thread_name_prefix="lake-stream"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.planner = Planner(
            self._resolve,
            cache.table_refs,
            datasets=datasets,
            limits=limits,
            partitions=partitions,
            external=external,
            scans=scans,
            walk_start=walk_start,
        )
        if admission is not None:
            # Memory refusals are admission refusals too (lake.status, the counter).
            self.planner.memory.on_refused = admission.note_refused
            memory = self.planner.memory
            series.QUERY_MEMORY_RESERVED.set_function(lambda: memory.reserved)
        #: Durable async queries (LAKE_ASYNC_QUERIES=true), built around this planner.
        self.async_queries = None if async_queries is None else async_queries(self)
        #: The native data plane's URI (lake_query.dataplane), advertised in endpoint
        #: locations once it serves; None: clients redeem tickets here.
        self.data_location: str | None = None

    def __repr__(self) -> str:
        return f"QueryHandler({self._cache!r})"

    def close(self) -> None:
        self.planning.close()
        self._streams.shutdown(wait=False, cancel_futures=True)

    # Threads.

    async def _blocking(self, tenant: str, fn: Callable[..., T], *args: Any) -> T:
        self._loop = asyncio.get_running_loop()
        return await self.planning.run(tenant, fn, *args)

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

    async def _moved_since(self, revision: int) -> bool:
        """Refresh the catalog; whether the view changed since ``revision``."""
        try:
            await asyncio.wait_for(self._cache.refresh(), REFRESH_TIMEOUT_S)
        except Exception as exc:
            raise Unavailable(
                f"a table version was reclaimed and the catalog could not be refreshed: {exc}; "
                "retry"
            ) from None
        return self._cache.revision != revision

    # Planning.

    async def _plan(
        self,
        spec: QuerySpec,
        principal: Principal,
        *,
        prepare: bool = False,
        wanted: Mapping[TableRef, int] | None = None,
    ) -> PlannedQuery:
        """Plan on a view within the freshness bound and at or past ``wanted`` (the
        client's committed versions, :mod:`lake_query.planning.freshness`).

        A head version retention reclaimed under this view (a replica behind
        its writers) is not the client's problem: the catalog is refreshed and
        the statement planned again, at most :data:`MAX_REPLANS` times and only
        while a refresh moves the view.
        """
        wire.check_sql(spec.sql, self._max_sql_bytes)
        self.readiness.check()
        await catch_up(self._cache, wanted or {}, principal, REFRESH_TIMEOUT_S)
        plan = functools.partial(self.planner.plan_spec, prepare=prepare)
        replans = 0
        while True:
            seen = self._cache.revision
            try:
                planned = await self._blocking(principal.tenant_id, plan, spec, principal)
                break
            except VersionReclaimed:
                if replans == MAX_REPLANS or not await self._moved_since(seen):
                    raise
                replans += 1
                log.info("planning met a reclaimed version; planning again", replans=replans)
        # Who read which tables is DEBUG only: INFO lines name no principal and no table.
        log.info("query planned", tables=len(planned.spec.pins))
        log.debug(
            "query planned by",
            principal=principal.principal_id,
            tables=[str(p.table) for p in planned.spec.pins],
        )
        return planned

    def _spec_of(self, command: Any, principal: Principal) -> QuerySpec | None:
        """The SQL statement (and bound parameters) a command runs; None: not a statement."""
        if isinstance(command, sql_pb.CommandStatementQuery):
            wire.no_transaction(command)
            return QuerySpec(sql=command.query)
        if isinstance(command, sql_pb.CommandPreparedStatementQuery):
            return self._statements.open(command.prepared_statement_handle, principal)
        return None

    async def _describe(
        self,
        descriptor: pb.FlightDescriptor,
        principal: Principal,
        wanted: Mapping[TableRef, int] | None = None,
    ) -> tuple[pa.Schema, list[dict[str, Any]]]:
        """The result schema of a descriptor and the ticket bodies (one per endpoint)."""
        if descriptor.type != pb.FlightDescriptor.CMD:
            raise InvalidArgument("Lake Query answers Flight SQL commands (CMD descriptors)")
        self.readiness.check()
        command = wire.unpack_any(descriptor.cmd, "the descriptor")
        spec = self._spec_of(command, principal)
        if spec is not None:
            planned = await self._plan(spec, principal, wanted=wanted)
        elif isinstance(command, wire.METADATA_COMMANDS):
            schema = discovery.metadata_schema(command)
            return schema, [{"k": wire.METADATA, "c": base64.b64encode(descriptor.cmd).decode()}]
        elif isinstance(command, wire.READ_ONLY_COMMANDS):
            raise ReadOnlySql()
        else:
            raise Unimplemented(f"{command.DESCRIPTOR.name} is not supported by Lake Query")
        return planned.schema, query_bodies(planned)

    # Flight RPCs.

    async def get_flight_info(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.FlightInfo:
        principal = caller()
        schema, bodies = await self._describe(descriptor, principal, min_versions(context))
        locations = self._locations(schema)
        endpoints = [
            pb.FlightEndpoint(
                ticket=pb.Ticket(ticket=self._sealer.seal(principal, body)), location=locations
            )
            for body in bodies
        ]
        return pb.FlightInfo(
            schema=schema_to_ipc(schema),
            flight_descriptor=descriptor,
            endpoint=endpoints,
            total_records=-1,
            total_bytes=-1,
        )

    def _locations(self, schema: pa.Schema) -> list[pb.Location]:
        # Replacement dictionaries need Lake's own encoder: such results stay here.
        if self.data_location is None or has_dictionary(schema):
            return []
        return [pb.Location(uri=self.data_location)]

    async def _plan_statement(
        self,
        descriptor: pb.FlightDescriptor,
        principal: Principal,
        wanted: Mapping[TableRef, int] | None = None,
    ) -> tuple[pa.Schema, QuerySpec]:
        schema, bodies = await self._describe(descriptor, principal, wanted)
        # A job runs the whole statement: partitions only split interactive results.
        if bodies[0].get("k") not in (wire.QUERY, PARTITION):
            raise InvalidArgument("PollFlightInfo runs SQL statements only")
        return schema, QuerySpec.model_validate(bodies[0]["q"])

    async def _statement(self, descriptor: pb.FlightDescriptor, principal: Principal) -> QuerySpec:
        """The statement a job submission names, unplanned: a retry is compared by it."""
        if descriptor.type == pb.FlightDescriptor.CMD:
            spec = self._spec_of(wire.unpack_any(descriptor.cmd, "the descriptor"), principal)
            if spec is not None:
                return spec
        raise InvalidArgument("PollFlightInfo runs SQL statements only")

    async def poll_flight_info(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.PollInfo:
        if self.async_queries is not None:
            principal = caller()
            headers = {key: str(value) for key, value in context.invocation_metadata() or ()}
            states = headers.get(protocol.ASYNC_STATES_HEADER) == "1"
            if descriptor.type == pb.FlightDescriptor.CMD and is_handle(descriptor.cmd):
                return await self.async_queries.poll(
                    descriptor.cmd,
                    principal,
                    states=states,
                    wait_s=_poll_wait_s(headers.get(protocol.ASYNC_WAIT_HEADER)),
                )
            return await self.async_queries.submit(
                descriptor,
                principal,
                headers.get(protocol.ASYNC_JOB_ID_HEADER),
                functools.partial(self._plan_statement, wanted=min_versions(context)),
                self._statement,
                states=states,
            )
        # Planning is synchronous, so the first poll is already complete
        # (no flight_descriptor to poll again).
        info = await self.get_flight_info(descriptor, context)
        return pb.PollInfo(info=info, progress=1.0)

    async def get_schema(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.SchemaResult:
        schema, _ = await self._describe(descriptor, caller(), min_versions(context))
        return pb.SchemaResult(schema=schema_to_ipc(schema))

    def open_ticket(self, ticket: bytes, principal: Principal) -> dict[str, Any]:
        """The body of a sealed ticket ``principal`` may redeem (refusals raise, before data)."""
        # Tickets carry SQL: the SQL size limit bounds them too.
        if len(ticket) > self._max_sql_bytes:
            raise InvalidArgument(f"the ticket exceeds {self._max_sql_bytes} bytes")
        return self._sealer.open(ticket, principal)

    def metadata_batch(self, body: dict[str, Any], principal: Principal) -> pa.RecordBatch:
        """The one batch of a metadata ticket's command."""
        self.readiness.check()  # answered from the catalog cache
        command = wire.unpack_any(base64.b64decode(body.get("c", "")), "the ticket")
        return discovery.metadata_batch(self._cache, command, principal)

    @staticmethod
    def query_of(body: dict[str, Any]) -> tuple[QuerySpec, list[int] | None]:
        """The query of a query or partition ticket's body, and its fragment ids (if any)."""
        try:
            spec = QuerySpec.model_validate(body.get("q"))
        except ValidationError:
            # Authentic, so sealed by a replica of another Lake version.
            raise InvalidArgument("ticket from an incompatible Lake Query version") from None
        return spec, fragments_of(body)

    def result_stream(
        self, query: tuple[QuerySpec, list[int] | None], principal: Principal
    ) -> ResultStream:
        """Run a ticket's query (:meth:`query_of`); blocking: call it on a stream thread."""
        spec, fragments = query
        if fragments is None:
            return self.planner.execute(spec, principal)
        return self.planner.execute_partition(spec, fragments, principal)

    async def list_flights(
        self, criteria: pb.Criteria, context: Context
    ) -> AsyncIterator[pb.FlightInfo]:
        """UNAVAILABLE while the replica does not serve, else UNIMPLEMENTED (no listing).

        Clients that wait for a server with ListFlights (pyarrow's and the SDK's
        ``wait_for_available``) thus wait until this replica serves statements.
        """
        self.readiness.check()
        async for info in super().list_flights(criteria, context):
            yield info

    async def do_get(self, ticket: pb.Ticket, context: Context) -> AsyncIterator[bytes]:
        principal = caller()
        body = self.open_ticket(ticket.ticket, principal)
        kind = body.get("k")
        messages: AsyncIterator[bytes]
        if kind in (wire.QUERY, PARTITION):
            messages = self._query_messages(body, principal, context)
        elif kind == wire.METADATA:
            batch = self.metadata_batch(body, principal)
            messages = prefetch(encode_stream(batch.schema, [batch]), self._streams)
        elif kind == PART and self.async_queries is not None:
            messages = self._part_messages(body, principal, context)
        else:
            raise Unauthenticated("invalid ticket")
        sent = 0
        async with contextlib.aclosing(messages):
            async for message in messages:
                sent += 1
                yield message
        log.debug("stream finished", messages=sent)

    def _query_messages(
        self, body: dict[str, Any], principal: Principal, context: Context
    ) -> AsyncIterator[bytes]:
        query = self.query_of(body)  # refused before admission

        def produce() -> Iterator[bytes]:
            # Opening the pinned tables and producing their messages run on
            # one stream thread, with no hop back to the loop in between.
            stream = self.result_stream(query, principal)
            try:
                yield from encode_stream(stream.schema, counted_rows(stream))
            finally:
                stream.close()  # a client gone mid-stream frees its memory reservation now

        async def start() -> AsyncIterator[bytes]:
            return prefetch(produce(), self._streams)

        if self._admission is None:
            return prefetch(produce(), self._streams)
        # The permit is held for the whole stream (lake_query.serving.admission).
        return self._admission.run(principal.tenant_id, context, start)

    def _part_messages(
        self, body: dict[str, Any], principal: Principal, context: Context
    ) -> AsyncIterator[bytes]:
        assert self.async_queries is not None
        parts = self.async_queries

        async def start() -> AsyncIterator[bytes]:
            return parts.part_messages(body, principal)

        if self._admission is None:
            return parts.part_messages(body, principal)
        # Part streams take the same admission permit as interactive DoGet, for their life.
        return self._admission.run(principal.tenant_id, context, start)

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Context
    ) -> AsyncIterator[pb.PutResult]:
        principal = caller()
        first = await anext(messages, None)
        if first is None:
            # What ADBC's adbc_ingest sends for an empty table or reader: not even its command.
            raise InvalidArgument(
                "DoPut carried no descriptor and no data: an ingest of zero rows "
                "(ADBC sends no message for one) has nothing to append"
            )
        if not first.HasField("flight_descriptor"):
            raise InvalidArgument("DoPut needs a descriptor on its first message")
        command = wire.put_command(first.flight_descriptor.cmd)
        if isinstance(command, protocol.AppendCommand):
            self.readiness.check()
            yield await self._appends.forward(command, first, messages, principal)
        elif isinstance(command, sql_pb.CommandPreparedStatementQuery):
            yield await self._statements.bind(command, first, messages, principal)
        elif isinstance(command, sql_pb.CommandStatementIngest):
            authorization = dict(context.invocation_metadata() or ()).get("authorization")
            yield await self._ingests.forward(command, first, messages, principal, authorization)
        elif isinstance(command, wire.READ_ONLY_COMMANDS):
            raise ReadOnlySql()
        else:
            name = getattr(getattr(command, "DESCRIPTOR", None), "name", type(command).__name__)
            raise Unimplemented(f"DoPut of {name} is not supported")

    async def _stage_action(self, kind: str, body: bytes, principal: Principal) -> bytes:
        if kind == stage_wire.MANAGED_STAGE:
            protocol.decode(stage_wire.StageRequest, body)
            return protocol.encode(self._stage.descriptor(principal))
        request = protocol.decode(stage_wire.ReadCapabilityRequest, body)
        return protocol.encode(await self._stage.read_capability(principal, request))

    async def do_action(self, action: pb.Action, context: Context) -> AsyncIterator[pb.Result]:
        principal = caller()
        kind = action.type
        if kind == CREATE_PREPARED_STATEMENT:
            request = wire.unpack_as(
                action.body, sql_pb.ActionCreatePreparedStatementRequest, "the action body"
            )
            wire.no_transaction(request)
            planned = await self._plan(
                QuerySpec(sql=request.query),
                principal,
                prepare=True,
                wanted=min_versions(context),
            )
            result = sql_pb.ActionCreatePreparedStatementResult(
                prepared_statement_handle=self._statements.seal(planned.spec, principal),
                dataset_schema=schema_to_ipc(planned.schema),
            )
            yield pb.Result(body=wire.pack(result))
        elif kind == CLOSE_PREPARED_STATEMENT:
            wire.unpack_as(
                action.body, sql_pb.ActionClosePreparedStatementRequest, "the action body"
            )
        elif kind == CLOSE_SESSION:
            closed = pb.CloseSessionResult(status=pb.CloseSessionResult.CLOSED)
            yield pb.Result(body=closed.SerializeToString())
        elif kind == CANCEL_FLIGHT_INFO:
            request = wire.parse_raw(action.body, pb.CancelFlightInfoRequest, "the action body")
            # (Not named `status`: that is the status module, used below.)
            outcome = pb.CANCEL_STATUS_CANCELLED
            handle = is_handle(request.info.flight_descriptor.cmd)
            if self.async_queries is not None and (handle or request.info.endpoint):
                outcome = await self.async_queries.cancel(request.info, principal)
            elif handle:
                # An async job's handle, and this replica runs none (LAKE_ASYNC_QUERIES
                # off): it cancels nothing, so it must not answer that it did.
                outcome = pb.CANCEL_STATUS_NOT_CANCELLABLE
            # Otherwise nothing runs before DoGet, and a DoGet is cancelled by its client.
            cancelled = pb.CancelFlightInfoResult(status=outcome)
            yield pb.Result(body=cancelled.SerializeToString())
        elif kind == protocol.TABLE_SCHEMA:
            self.readiness.check()
            yield pb.Result(body=await discovery.table_schema(self._cache, action.body, principal))
        elif kind == protocol.LIST_TABLES:
            self.readiness.check()
            yield pb.Result(body=self._tables.listing(bytes(action.body), principal))
        elif kind in (protocol.CREATE_TABLE, protocol.DROP_TABLE):
            self.readiness.check()
            authorization = dict(context.invocation_metadata() or ()).get("authorization")
            chore = self._tables.create if kind == protocol.CREATE_TABLE else self._tables.drop
            yield pb.Result(body=await chore(bytes(action.body), principal, authorization))
        elif kind in (stage_wire.MANAGED_STAGE, stage_wire.READ_CAPABILITY):
            yield pb.Result(body=await self._stage_action(kind, bytes(action.body), principal))
        elif kind == status.STATUS:
            yield pb.Result(body=protocol.encode(self._status(principal)))
        else:
            raise Unimplemented(f"action {kind[:100]!r} is not supported by Lake Query")

    def _status(self, principal: Principal) -> status.QueryStatus:
        """``lake.status``: admission (admins only), health, catalog view and memory."""
        figures = replica_status(self._admission, self._cache, principal)
        age = self._cache.age_s()
        memory = self.planner.memory
        return figures.model_copy(
            update={
                "serving": self.readiness.serving,
                "not_serving": tuple(sorted(self.readiness.reasons())),
                "catalog_tables": len(self._cache.tables()),
                "catalog_age_ms": None if age is None else int(age * 1000),
                "memory": status.MemoryStatus(
                    reserved_bytes=memory.reserved, limit_bytes=memory.total_bytes
                ),
            }
        )

    async def list_actions(self, context: Context) -> AsyncIterator[pb.ActionType]:
        for name, description in _ACTIONS.items():
            yield pb.ActionType(type=name, description=description)
