"""Key lookups planned without DataFusion: ``SELECT c, ... FROM t WHERE k = <integer>``.

A point query's GetFlightInfo spent most of its time building a DataFusion
session, planning the SQL and walking the plan back out through the Python
bindings (about 1 ms of 1.6 ms; 1.9 ms for a 30-key ``IN`` list), only for
:mod:`~lake_query.planning.direct` to hand the scan to Lance anyway. This
module recognises those statement shapes from their text and builds the same
:class:`DirectScan` DataFusion's plan would give, so planning only authorizes
and pins the table.

The shape is strict, and anything outside it goes to DataFusion unchanged:
lower-case unquoted names that are not SQL keywords, a table named by one to
three parts (the catalog, if named, ``lake``), ``*`` or distinct columns the
table has, one ``int64`` key column compared with ``=`` to a decimal integer
its type holds (not the smallest int64, which Lance's parser refuses), or
``IN`` a non-empty list of such integers (kept as written: order and
duplicates are Lance's to handle, as they are on DataFusion's path; a NULL,
a cast or any other literal is not the shape), no parameters. Errors (an
unknown table, a hidden namespace) are left for DataFusion's planning to
raise, so their class and text stay as they were.
``test_lookups_differential`` checks the schema, pins, partitions, scan and
rows against DataFusion's path over generated statements and tables.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from lake_core.names import DEFAULT_CATALOG
from lake_query.planning.catalog import DEFAULT_SCHEMA
from lake_query.planning.direct import DirectScan, batch_rows_for

__all__ = ["KeyLookup", "parse_lookup"]

_NAME = r"[a-z_][a-z0-9_]*"
_INTEGER = r"-?[0-9]{1,19}"
_STATEMENT = re.compile(
    rf"\s*(?i:select)\s+(?P<columns>\*|{_NAME}(?:\s*,\s*{_NAME})*)"
    rf"\s+(?i:from)\s+(?P<table>{_NAME}(?:\.{_NAME}){{0,2}})"
    rf"\s+(?i:where)\s+(?P<key>{_NAME})"
    rf"(?:\s*=\s*(?P<value>{_INTEGER})"
    rf"|\s+(?i:in)\s*\(\s*(?P<values>{_INTEGER}(?:\s*,\s*{_INTEGER})*)\s*\))\s*"
)
#: Words DataFusion's parser may read as keywords where the shape expects a name
#: (``current_date`` is the function even when the table has such a column).
_KEYWORDS = frozenset(
    [
        "all",
        "and",
        "as",
        "asc",
        "between",
        "by",
        "case",
        "cast",
        "cross",
        "current_date",
        "current_time",
        "current_timestamp",
        "desc",
        "distinct",
        "else",
        "end",
        "except",
        "exists",
        "false",
        "fetch",
        "from",
        "full",
        "group",
        "having",
        "ilike",
        "in",
        "inner",
        "intersect",
        "interval",
        "is",
        "join",
        "lateral",
        "left",
        "like",
        "limit",
        "natural",
        "not",
        "null",
        "offset",
        "on",
        "or",
        "order",
        "outer",
        "right",
        "select",
        "similar",
        "struct",
        "then",
        "trim",
        "true",
        "union",
        "using",
        "values",
        "when",
        "where",
        "window",
        "with",
    ]
)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class KeyLookup:
    """A recognised statement: which table, which columns, which key values.

    ``columns``: None for ``*``. ``in_list``: ``key IN (values)``, else ``key = values[0]``.
    """

    namespace: str
    table: str
    columns: tuple[str, ...] | None
    key: str
    values: tuple[int, ...]
    in_list: bool = False

    def scan(self, table_schema: pa.Schema) -> DirectScan | None:
        """The direct scan over a table of ``table_schema``; None if the shape does not hold."""
        names = table_schema.names
        columns = tuple(names) if self.columns is None else self.columns
        if len(set(names)) != len(names) or len(set(columns)) != len(columns):
            return None
        if not all(c in names for c in columns) or self.key not in names:
            return None
        if table_schema.field(self.key).type != pa.int64():
            return None
        schema = pa.schema([table_schema.field(c) for c in columns])
        # What pushdown.to_lance_filter renders for DataFusion's ``key = value``
        # and ``key IN (values)``.
        if self.in_list:
            row_filter = f"(`{self.key}` IN ({', '.join(map(str, self.values))}))"
        else:
            row_filter = f"(`{self.key}` = {self.values[0]})"
        return DirectScan(
            list(columns), row_filter, batch_rows_for(schema), schema, cacheable=False
        )


def parse_lookup(sql: str, has_parameters: bool = False) -> KeyLookup | None:
    """``sql`` as a key lookup, or None when it is anything else."""
    if has_parameters:
        return None
    match = _STATEMENT.fullmatch(sql)
    if match is None:
        return None
    columns = None
    if match["columns"] != "*":
        columns = tuple(c.strip() for c in match["columns"].split(","))
    parts = match["table"].split(".")
    if len(parts) == 3 and parts[0] != DEFAULT_CATALOG:
        return None
    if any(word in _KEYWORDS for word in (*(columns or ()), *parts, match["key"])):
        return None
    in_list = match["values"] is not None
    listed = match["values"].split(",") if in_list else [match["value"]]
    values = tuple(int(v) for v in listed)
    if not all(_INT64_MIN < v <= _INT64_MAX for v in values):
        return None
    namespace = parts[-2] if len(parts) >= 2 else DEFAULT_SCHEMA
    return KeyLookup(namespace, parts[-1], columns, match["key"], values, in_list)
