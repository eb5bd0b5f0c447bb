"""Flight SQL catalog discovery, answered from the catalog cache alone.

GetCatalogs, GetDbSchemas, GetTables (optionally with each table's Arrow IPC
schema) and GetTableTypes build their result batches from the in-memory
cache: no metadata I/O on the request path. Callers only see namespaces
they are granted. Result schemas follow FlightSql.proto exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import pyarrow as pa

from lake_core.names import DEFAULT_CATALOG
from lake_core.principal import Principal
from lake_query.planning.catalog_cache import CatalogCache

__all__ = [
    "CATALOGS_SCHEMA",
    "DB_SCHEMAS_SCHEMA",
    "TABLES_SCHEMA",
    "TABLES_WITH_SCHEMA_SCHEMA",
    "TABLE_TYPE",
    "TABLE_TYPES_SCHEMA",
    "catalogs_batch",
    "db_schemas_batch",
    "like_matcher",
    "table_types_batch",
    "tables_batch",
]

#: The one table type Lake has.
TABLE_TYPE = "TABLE"

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8(), nullable=False),
    ]
)
TABLES_SCHEMA = pa.schema(
    [
        pa.field("catalog_name", pa.utf8()),
        pa.field("db_schema_name", pa.utf8()),
        pa.field("table_name", pa.utf8(), nullable=False),
        pa.field("table_type", pa.utf8(), nullable=False),
    ]
)
TABLES_WITH_SCHEMA_SCHEMA = TABLES_SCHEMA.append(
    pa.field("table_schema", pa.binary(), nullable=False)
)
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])


@lru_cache(maxsize=256)
def _like_regex(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        parts.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(parts), re.DOTALL)


def like_matcher(pattern: str | None) -> re.Pattern[str] | None:
    """A full-match regex for a SQL LIKE pattern (``%``, ``_``, ``\\`` escape); None matches all."""
    if pattern is None:
        return None
    return _like_regex(pattern)


def _matches(matcher: re.Pattern[str] | None, value: str) -> bool:
    return matcher is None or matcher.fullmatch(value) is not None


def _catalog_matches(catalog: str | None) -> bool:
    # Unset means any catalog; an empty string means "without a catalog".
    return catalog is None or catalog == DEFAULT_CATALOG


def catalogs_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"catalog_name": DEFAULT_CATALOG}], schema=CATALOGS_SCHEMA)


def db_schemas_batch(
    cache: CatalogCache,
    principal: Principal,
    catalog: str | None,
    schema_pattern: str | None,
) -> pa.RecordBatch:
    matcher = like_matcher(schema_pattern)
    rows = []
    if _catalog_matches(catalog):
        rows = [
            {"catalog_name": DEFAULT_CATALOG, "db_schema_name": ns}
            for ns in cache.namespaces()
            if principal.may_see(ns) and _matches(matcher, ns)
        ]
    return pa.RecordBatch.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def tables_batch(
    cache: CatalogCache,
    principal: Principal,
    catalog: str | None,
    schema_pattern: str | None,
    table_pattern: str | None,
    table_types: Sequence[str],
    include_schema: bool,
) -> pa.RecordBatch:
    """GetTables rows, ordered by namespace then name; schemas come from the cache."""
    schema = TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA
    wanted_type = not table_types or TABLE_TYPE in {t.upper() for t in table_types}
    if not (_catalog_matches(catalog) and wanted_type):
        return _empty(schema)
    schemas_match = like_matcher(schema_pattern)
    tables_match = like_matcher(table_pattern)
    rows = []
    for cached in cache.tables():
        ref = cached.table
        if not principal.may_see(ref.namespace):
            continue
        if not (_matches(schemas_match, ref.namespace) and _matches(tables_match, ref.name)):
            continue
        row: dict[str, object] = {
            "catalog_name": DEFAULT_CATALOG,
            "db_schema_name": ref.namespace,
            "table_name": ref.name,
            "table_type": TABLE_TYPE,
        }
        if include_schema:
            row["table_schema"] = cached.schema_ipc()
        rows.append(row)
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def table_types_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"table_type": TABLE_TYPE}], schema=TABLE_TYPES_SCHEMA)


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)
