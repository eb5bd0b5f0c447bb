"""Flight SQL bulk ingest (``CommandStatementIngest``), streamed through to Metasrv.

ADBC's ``adbc_ingest`` (and polars' ``write_database(engine="adbc")``,
pandas' ``to_sql`` over an ADBC connection, the SDK's ``ingest``) send one
DoPut whose descriptor is a ``CommandStatementIngest``. The replica
authorizes the namespace, maps the ingest options to a Lake
:class:`~lake_core.protocol.IngestCommand` and streams the messages to
Metasrv unchanged, holding none of them (``create`` and ``create_append``
first create a missing table, for an admin caller, with the caller's own
credentials: :meth:`Ingests._create`): Metasrv checks, writes and commits
the whole stream as one append (:mod:`lake_metasrv.ingest`), as the same
principal. The last message Query sends is the end marker: a client that
goes away mid-stream cancels the forwarded call before it, so nothing
commits. A client that ends its stream itself (the SDK: ingest option
:data:`~lake_core.protocol.INGEST_END_OPTION`) closes it with its own end
marker; closed without it, the stream was cut short and Query forwards no
marker, so Metasrv refuses it (``Aborted``). Other clients' close is the end.

The reply is the ``DoPutUpdateResult`` ADBC reads (``record_count``), or,
when the command's options ask for it (``lake.result=lake``, the SDK), Lake's
:class:`~lake_core.protocol.IngestResult` with the version.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

import pyarrow as pa
import structlog

from lake_core import protocol
from lake_core.errors import (
    InvalidArgument,
    PermissionDenied,
    TableExists,
    Unimplemented,
)
from lake_core.flight.encoding import FlightDataDecoder, InvalidFlightData
from lake_core.ids import new_operation_id, parse_operation_id
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_query.flightsql.discovery import refresh_quietly
from lake_query.flightsql.wire import no_transaction
from lake_query.planning.catalog_cache import CatalogCache

__all__ = ["OPERATION_ID_OPTION", "RESULT_OPTION", "IngestSink", "Ingests", "ingest_mode"]

log = structlog.get_logger("lake_query.flightsql")

#: Ingest option asking for Lake's IngestResult (JSON) instead of DoPutUpdateResult.
RESULT_OPTION = "lake.result"
#: Ingest option carrying the client's operation id (UUIDv7): a retry commits at most once.
OPERATION_ID_OPTION = "lake.operation_id"

_Options = sql_pb.CommandStatementIngest.TableDefinitionOptions


@runtime_checkable
class IngestSink(Protocol):
    """Where ingests go (``lake_core.metaclient.MetaClient`` in production)."""

    async def ingest_messages(
        self, messages: AsyncIterator[pb.FlightData], *, on_behalf_of: Principal | None = None
    ) -> protocol.IngestResult: ...

    async def create_table_as_caller(
        self, table: TableRef, schema: pa.Schema, authorization: str | None
    ) -> protocol.DescribeTableResult: ...


def ingest_mode(
    options: sql_pb.CommandStatementIngest.TableDefinitionOptions,
) -> protocol.IngestMode:
    """ADBC's ingest modes as Lake's (``replace`` is refused: Lake tables only grow)."""
    if options.if_exists == _Options.TABLE_EXISTS_OPTION_REPLACE:
        raise Unimplemented(
            "ingest mode 'replace' is not supported: Lake tables are append-only "
            "(use mode 'append', 'create' or 'create_append')"
        )
    create = options.if_not_exist == _Options.TABLE_NOT_EXIST_OPTION_CREATE
    if options.if_exists == _Options.TABLE_EXISTS_OPTION_FAIL:
        if not create:
            raise InvalidArgument("an ingest that fails whether or not the table exists")
        return "create"
    return "create_append" if create else "append"


def _table(command: sql_pb.CommandStatementIngest) -> TableRef:
    if command.HasField("catalog") and command.catalog not in ("", "lake"):
        raise InvalidArgument(
            f"Lake ingests into the 'lake' catalog, not {command.catalog[:100]!r}"
        )
    if command.HasField("schema") and command.schema:
        return TableRef(namespace=command.schema, name=command.table)
    if "." in command.table:
        return TableRef.parse(command.table)
    raise InvalidArgument("name the table's namespace: db_schema_name=... (or 'namespace.table')")


class Ingests:
    """Authorizes ingests and streams them to Metasrv, for one replica."""

    def __init__(self, cache: CatalogCache, sink: IngestSink | None) -> None:
        self._cache = cache
        self._sink = sink

    async def forward(
        self,
        command: sql_pb.CommandStatementIngest,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
        authorization: str | None = None,
    ) -> pb.PutResult:
        """Stream one ingest to Metasrv; ``authorization``: the caller's header (for a create)."""
        no_transaction(command)
        if command.temporary:
            raise Unimplemented("Lake has no temporary tables")
        table = _table(command)
        mode = ingest_mode(command.table_definition_options)
        if not principal.may_see(table.namespace):
            raise PermissionDenied(f"permission denied: {table.qualified}")
        if self._sink is None:
            raise Unimplemented("this Query replica does not accept appends")
        operation_id = command.options.get(OPERATION_ID_OPTION) or new_operation_id()
        parse_operation_id(operation_id)
        created = await self._create(self._sink, table, mode, first, principal, authorization)
        lake = protocol.IngestCommand(table=table, operation_id=operation_id)
        head = pb.FlightData()
        head.CopyFrom(first)
        head.app_metadata = b""
        head.flight_descriptor.CopyFrom(
            pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=protocol.encode(lake))
        )

        # With the option, the client's own last message says it finished; else its close does.
        marked = command.options.get(protocol.INGEST_END_OPTION) == protocol.INGEST_END_BY_MARKER

        async def forwarded() -> AsyncIterator[pb.FlightData]:
            yield head
            finished = first.app_metadata == protocol.INGEST_END
            async for message in messages:
                finished = message.app_metadata == protocol.INGEST_END
                if marked and finished and not (message.data_header or message.data_body):
                    continue
                if message.app_metadata:
                    message.app_metadata = b""  # only Query ends the stream
                yield message
            if finished or not marked:
                yield pb.FlightData(app_metadata=protocol.INGEST_END)
            # Else the stream was cut short: Metasrv refuses it (Aborted), commits nothing.

        # Metasrv authorizes again, as this principal (lake_core.auth).
        result = await self._sink.ingest_messages(forwarded(), on_behalf_of=principal)
        log.info(
            "ingest forwarded",
            table=str(result.table),
            rows=result.rows,
            version=result.version,
            created=created,
        )
        # Refresh before replying so this replica reads its own writes.
        await refresh_quietly(self._cache)
        if command.options.get(RESULT_OPTION) == "lake":
            return pb.PutResult(app_metadata=protocol.encode(result))
        update = sql_pb.DoPutUpdateResult(record_count=result.rows)
        return pb.PutResult(app_metadata=update.SerializeToString())

    async def _create(
        self,
        sink: IngestSink,
        table: TableRef,
        mode: protocol.IngestMode,
        first: pb.FlightData,
        principal: Principal,
        authorization: str | None,
    ) -> bool:
        """Create the table for the ``create`` modes where it is missing; True if created.

        Creating is administrative (``lake.create_table`` needs an admin): the
        caller must be one, and the create goes to Metasrv with the caller's own
        credentials, never as this replica's delegated data-plane call.
        """
        if mode == "append":
            return False
        if self._cache.entry(table) is None:
            await refresh_quietly(self._cache)
        if self._cache.entry(table) is not None:
            if mode == "create":
                raise TableExists(table)
            return False
        if principal.role != "admin":
            raise PermissionDenied(
                f"permission denied: creating {table.qualified} needs an admin principal"
            )
        decoder = FlightDataDecoder(max_bytes=protocol.MAX_APPEND_BYTES, too_large=InvalidArgument)
        try:
            decoder.feed(first)
        except InvalidFlightData as exc:
            raise InvalidArgument(f"invalid ingest data: {exc}") from None
        if decoder.schema is None:
            raise InvalidArgument("an ingest's first message needs the Arrow schema")
        try:
            await sink.create_table_as_caller(table, decoder.schema, authorization)
        except TableExists:
            if mode == "create":
                raise
            return False  # created meanwhile: create_append appends
        log.info("table created for an ingest", table=str(table), principal=principal.principal_id)
        return True
