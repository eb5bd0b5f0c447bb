"""Table chores through Query: create, drop and list, so clients need no second address.

``lake.create_table`` and ``lake.drop_table`` are administrative on Metasrv.
A replica relays them with the caller's own ``authorization`` header (as a
bulk ingest's ``create`` mode does): Metasrv authorizes the caller itself,
never this replica's delegated data-plane credential, so a token works here
exactly as it works with ``lake client``. The replica checks the namespace
and the role first, with the message a hidden table gets, and refreshes its
catalog before it answers, so its next statement sees the change.

``lake.list_tables`` answers from the catalog cache: every table the caller
may see, with its version and schema.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import pyarrow as pa
import structlog

from lake_core import protocol
from lake_core.errors import PermissionDenied, Unimplemented
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.schemas import schema_from_base64
from lake_query.flightsql.discovery import refresh_quietly
from lake_query.planning.catalog_cache import CatalogCache

__all__ = ["TableChores", "TableSink"]

log = structlog.get_logger("lake_query.flightsql")


@runtime_checkable
class TableSink(Protocol):
    """Where table DDL goes (``lake_core.metaclient.MetaClient`` in production)."""

    async def create_table_as_caller(
        self, table: TableRef, schema: pa.Schema, authorization: str | None
    ) -> protocol.DescribeTableResult: ...

    async def drop_table_as_caller(
        self, table: TableRef, authorization: str | None
    ) -> protocol.DropTableResult: ...


def _admin(principal: Principal, table: TableRef) -> None:
    # The namespace first, with one message: the role check reveals nothing more.
    if not principal.may_see(table.namespace) or principal.role != "admin":
        raise PermissionDenied(f"permission denied: {table.qualified}")


class TableChores:
    """Create, drop and list tables for one replica."""

    def __init__(self, cache: CatalogCache, sink: object | None) -> None:
        self._cache = cache
        self._sink = sink if isinstance(sink, TableSink) else None

    def _target(self) -> TableSink:
        if self._sink is None:
            raise Unimplemented("this Query replica does not forward table changes")
        return self._sink

    async def create(self, body: bytes, principal: Principal, authorization: str | None) -> bytes:
        request = protocol.decode(protocol.CreateTableRequest, body)
        _admin(principal, request.table)
        schema = schema_from_base64(request.schema_ipc)  # InvalidArgument before any call
        result = await self._target().create_table_as_caller(request.table, schema, authorization)
        log.info("table created through Query", principal=principal.principal_id)
        await refresh_quietly(self._cache)
        return protocol.encode(result)

    async def drop(self, body: bytes, principal: Principal, authorization: str | None) -> bytes:
        request = protocol.decode(protocol.TableRequest, body)
        _admin(principal, request.table)
        result = await self._target().drop_table_as_caller(request.table, authorization)
        log.info("table dropped through Query", principal=principal.principal_id)
        await refresh_quietly(self._cache)
        return protocol.encode(result)

    def listing(self, body: bytes, principal: Principal) -> bytes:
        protocol.decode(protocol.ListTablesRequest, body)
        entries = sorted(
            (c.entry for c in self._cache.tables() if principal.may_see(c.table.namespace)),
            key=lambda e: (e.table.namespace, e.table.name),
        )
        return protocol.encode(protocol.ListTablesResult(tables=entries))
