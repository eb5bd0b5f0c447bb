"""Catalog discovery and SQL info, answered from memory.

GetCatalogs, GetDbSchemas, GetTables, GetTableTypes and GetSqlInfo are
planned into a metadata ticket and answered from the catalog cache; Lake's
``TableSchema`` action answers a table's schema and version the same way.
"""

from __future__ import annotations

import asyncio

import pyarrow as pa
import structlog
from google.protobuf.message import Message  # type: ignore[import-untyped, unused-ignore]

from lake_core import protocol
from lake_core.errors import InvalidArgument, PermissionDenied, TableNotFound
from lake_core.principal import Principal
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_query.flightsql import catalogs
from lake_query.flightsql.sqlinfo import SQL_INFO_SCHEMA, sql_info_batch
from lake_query.planning.catalog_cache import CatalogCache

__all__ = [
    "REFRESH_TIMEOUT_S",
    "metadata_batch",
    "metadata_schema",
    "refresh_quietly",
    "table_schema",
]

log = structlog.get_logger("lake_query.flightsql")

#: Longest wait for a catalog refresh on a planning miss or after an append.
REFRESH_TIMEOUT_S = 10.0


async def refresh_quietly(cache: CatalogCache) -> None:
    """Refresh the catalog now if it answers in time; otherwise soon, in the background."""
    try:
        await asyncio.wait_for(cache.refresh(), REFRESH_TIMEOUT_S)
    except Exception as exc:
        log.warning("catalog refresh failed", error=str(exc))
        cache.refresh_soon()


def _optional(command: Message, name: str) -> str | None:
    return getattr(command, name) if command.HasField(name) else None


def metadata_schema(command: Message) -> pa.Schema:
    """The result schema of a metadata command."""
    if isinstance(command, sql_pb.CommandGetSqlInfo):
        return SQL_INFO_SCHEMA
    if isinstance(command, sql_pb.CommandGetCatalogs):
        return catalogs.CATALOGS_SCHEMA
    if isinstance(command, sql_pb.CommandGetDbSchemas):
        return catalogs.DB_SCHEMAS_SCHEMA
    if isinstance(command, sql_pb.CommandGetTables):
        return (
            catalogs.TABLES_WITH_SCHEMA_SCHEMA if command.include_schema else catalogs.TABLES_SCHEMA
        )
    return catalogs.TABLE_TYPES_SCHEMA


def metadata_batch(cache: CatalogCache, command: Message, principal: Principal) -> pa.RecordBatch:
    """A metadata command's one result batch, as ``principal`` may see it."""
    if isinstance(command, sql_pb.CommandGetSqlInfo):
        return sql_info_batch(list(command.info))
    if isinstance(command, sql_pb.CommandGetCatalogs):
        return catalogs.catalogs_batch()
    if isinstance(command, sql_pb.CommandGetDbSchemas):
        return catalogs.db_schemas_batch(
            cache,
            principal,
            _optional(command, "catalog"),
            _optional(command, "db_schema_filter_pattern"),
        )
    if isinstance(command, sql_pb.CommandGetTables):
        return catalogs.tables_batch(
            cache,
            principal,
            _optional(command, "catalog"),
            _optional(command, "db_schema_filter_pattern"),
            _optional(command, "table_name_filter_pattern"),
            list(command.table_types),
            command.include_schema,
        )
    if isinstance(command, sql_pb.CommandGetTableTypes):
        return catalogs.table_types_batch()
    raise InvalidArgument("invalid ticket")


async def table_schema(cache: CatalogCache, body: bytes, principal: Principal) -> bytes:
    """Lake's ``TableSchema`` action: a table's schema and version from the cache."""
    table = protocol.decode(protocol.TableRequest, body).table
    if not principal.may_see(table.namespace):
        raise PermissionDenied(f"permission denied: {table.qualified}")
    cached = cache.lookup(table)
    if cached is None:
        await refresh_quietly(cache)
        cached = cache.lookup(table)
    if cached is None:
        raise TableNotFound(table.qualified)
    cached.schema_ipc()  # fail explicitly for a registration without a schema
    return protocol.encode(protocol.DescribeTableResult(entry=cached.entry))
