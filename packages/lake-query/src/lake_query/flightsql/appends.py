"""Lake's append DoPut, as a Query replica forwards it to Metasrv.

The replica authorizes the namespace, checks the table exists, checks FILE
cells against the caller's managed stage prefix, and forwards the messages
unchanged; Metasrv authorizes again as the same principal. The SDK never
talks to Metasrv itself.

Before the client is answered, the commit result (its version and
descriptor) moves this replica's catalog view of the table, with no RPC:
every statement planned here afterwards reads the append.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import structlog

from lake_core import protocol
from lake_core.errors import InvalidArgument, PermissionDenied, TableNotFound, Unimplemented
from lake_core.filetype import is_file_field
from lake_core.flight.encoding import FlightDataDecoder, InvalidFlightData
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_query.flightsql.discovery import refresh_quietly
from lake_query.flightsql.stage import QueryStage
from lake_query.planning.catalog_cache import CatalogCache

__all__ = ["AppendSink", "Appends"]

log = structlog.get_logger("lake_query.flightsql")


class AppendSink(Protocol):
    """Where appends go (``lake_core.metaclient.MetaClient`` in production)."""

    async def append_messages(
        self, messages: AsyncIterator[pb.FlightData], *, on_behalf_of: Principal | None = None
    ) -> protocol.AppendResult: ...


class Appends:
    """Checks and forwards appends for one replica."""

    def __init__(self, cache: CatalogCache, sink: AppendSink | None, stage: QueryStage) -> None:
        self._cache = cache
        self._sink = sink
        self._stage = stage

    async def forward(
        self,
        command: protocol.AppendCommand,
        first: pb.FlightData,
        messages: AsyncIterator[pb.FlightData],
        principal: Principal,
    ) -> pb.PutResult:
        if not principal.may_see(command.table.namespace):
            raise PermissionDenied(f"permission denied: {command.table.qualified}")
        if self._sink is None:
            raise Unimplemented("this Query replica does not accept appends")
        if self._cache.entry(command.table) is None:
            await refresh_quietly(self._cache)
            if self._cache.entry(command.table) is None:
                raise TableNotFound(command.table.qualified)

        checked = await self._check_file_cells(command.table, first, messages, principal)

        async def forwarded() -> AsyncIterator[pb.FlightData]:
            if checked is not None:
                for message in checked:
                    yield message
                return
            yield first
            async for message in messages:
                yield message

        # Metasrv authorizes the append again, as this principal (lake_core.auth).
        result = await self._sink.append_messages(forwarded(), on_behalf_of=principal)
        log.info(
            "append forwarded",
            table=str(result.table),
            version=result.version,
            replayed=result.replayed,
        )
        # Before replying, so this replica reads its own writes (no refresh RPC).
        if not self._cache.apply_commit(result.table, result.descriptor):
            known = self._cache.entry(result.table)
            if known is None or known.descriptor.incarnation != result.descriptor.incarnation:
                # A table this view does not hold as committed (created or recreated
                # since): the catalog itself has to say what it is.
                await refresh_quietly(self._cache)
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
