"""Flight SQL ``GetSqlInfo``: what Lake's SQL surface supports.

The result schema is fixed by FlightSql.proto::

    info_name: uint32 not null,
    value: dense_union<string_value: utf8, bool_value: bool, bigint_value: int64,
                       int32_bitmask: int32, string_list: list<utf8>,
                       int32_to_int32_list_map: map<int32, list<int32>>>

All six union children must be present in that order: clients (ADBC's Go
driver among them) pick a child by its type code and cast it blindly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version

import pyarrow as pa

from lake_core.proto import flight_sql_pb2 as sql_pb

__all__ = ["SQL_INFO", "SQL_INFO_SCHEMA", "SqlInfoValue", "sql_info_batch"]

SqlInfoValue = str | bool | int | list[str] | dict[int, list[int]]

# Type codes of the value union, in FlightSql.proto order.
_STRING, _BOOL, _BIGINT, _INT32, _STRING_LIST, _INT32_MAP = range(6)

_VALUE_FIELDS = [
    pa.field("string_value", pa.utf8()),
    pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()),
    pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(pa.utf8())),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
]
_VALUE_TYPE = pa.dense_union(_VALUE_FIELDS, type_codes=list(range(6)))

SQL_INFO_SCHEMA = pa.schema(
    [
        pa.field("info_name", pa.uint32(), nullable=False),
        pa.field("value", _VALUE_TYPE, nullable=False),
    ]
)


class _Int32(int):
    """An int sent as ``int32_bitmask`` rather than ``bigint_value``."""


def _lake_version() -> str:
    try:
        return version("lake-query")
    except PackageNotFoundError:
        return "0+unknown"


_KEYWORDS = [
    "ANALYZE", "DESCRIBE", "EXPLAIN", "FULL", "ILIKE", "INTERVAL", "LATERAL",
    "LIMIT", "OFFSET", "QUALIFY", "UNNEST", "VERBOSE",
]  # fmt: skip
_NUMERIC = [
    "abs", "acos", "asin", "atan", "atan2", "cbrt", "ceil", "cos", "degrees", "exp",
    "floor", "ln", "log", "log10", "log2", "pi", "power", "radians", "random", "round",
    "signum", "sin", "sqrt", "tan", "trunc",
]  # fmt: skip
_STRINGS = [
    "ascii", "btrim", "char_length", "concat", "concat_ws", "initcap", "left", "length",
    "lower", "lpad", "ltrim", "regexp_match", "regexp_replace", "repeat", "replace",
    "reverse", "right", "rpad", "rtrim", "split_part", "starts_with", "strpos",
    "substr", "translate", "trim", "upper",
]  # fmt: skip
_DATETIME = [
    "current_date", "current_time", "date_bin", "date_part", "date_trunc", "from_unixtime",
    "now", "to_timestamp", "to_timestamp_millis", "to_timestamp_seconds",
]  # fmt: skip

#: Values Lake reports. Integers are int64 unless wrapped in ``_Int32``.
SQL_INFO: Mapping[int, SqlInfoValue] = {
    sql_pb.FLIGHT_SQL_SERVER_NAME: "Lake Query",
    sql_pb.FLIGHT_SQL_SERVER_VERSION: _lake_version(),
    sql_pb.FLIGHT_SQL_SERVER_ARROW_VERSION: "1.5",
    sql_pb.FLIGHT_SQL_SERVER_READ_ONLY: True,
    sql_pb.FLIGHT_SQL_SERVER_SQL: True,
    sql_pb.FLIGHT_SQL_SERVER_SUBSTRAIT: False,
    sql_pb.FLIGHT_SQL_SERVER_TRANSACTION: _Int32(sql_pb.SQL_SUPPORTED_TRANSACTION_NONE),
    sql_pb.FLIGHT_SQL_SERVER_CANCEL: False,
    # CommandStatementIngest (lake_query.flightsql.ingest); SQL itself stays read-only.
    sql_pb.FLIGHT_SQL_SERVER_BULK_INGESTION: True,
    sql_pb.FLIGHT_SQL_SERVER_INGEST_TRANSACTIONS_SUPPORTED: False,
    sql_pb.FLIGHT_SQL_SERVER_STATEMENT_TIMEOUT: _Int32(0),
    sql_pb.FLIGHT_SQL_SERVER_TRANSACTION_TIMEOUT: _Int32(0),
    sql_pb.SQL_DDL_CATALOG: False,
    sql_pb.SQL_DDL_SCHEMA: False,
    sql_pb.SQL_DDL_TABLE: False,
    sql_pb.SQL_IDENTIFIER_CASE: _Int32(sql_pb.SQL_CASE_SENSITIVITY_LOWERCASE),
    sql_pb.SQL_IDENTIFIER_QUOTE_CHAR: '"',
    sql_pb.SQL_QUOTED_IDENTIFIER_CASE: _Int32(sql_pb.SQL_CASE_SENSITIVITY_CASE_INSENSITIVE),
    sql_pb.SQL_ALL_TABLES_ARE_SELECTABLE: True,
    sql_pb.SQL_NULL_ORDERING: _Int32(sql_pb.SQL_NULLS_SORTED_AT_END),
    sql_pb.SQL_KEYWORDS: _KEYWORDS,
    sql_pb.SQL_NUMERIC_FUNCTIONS: _NUMERIC,
    sql_pb.SQL_STRING_FUNCTIONS: _STRINGS,
    sql_pb.SQL_SYSTEM_FUNCTIONS: ["arrow_typeof", "arrow_cast"],
    sql_pb.SQL_DATETIME_FUNCTIONS: _DATETIME,
    sql_pb.SQL_SEARCH_STRING_ESCAPE: "\\",
    sql_pb.SQL_EXTRA_NAME_CHARACTERS: "",
    sql_pb.SQL_SUPPORTS_COLUMN_ALIASING: True,
    sql_pb.SQL_NULL_PLUS_NULL_IS_NULL: True,
    sql_pb.SQL_SUPPORTS_TABLE_CORRELATION_NAMES: True,
    sql_pb.SQL_SUPPORTS_DIFFERENT_TABLE_CORRELATION_NAMES: False,
    sql_pb.SQL_SUPPORTS_EXPRESSIONS_IN_ORDER_BY: True,
    sql_pb.SQL_SUPPORTS_ORDER_BY_UNRELATED: True,
    sql_pb.SQL_SUPPORTED_GROUP_BY: _Int32(
        (1 << sql_pb.SQL_GROUP_BY_UNRELATED) | (1 << sql_pb.SQL_GROUP_BY_BEYOND_SELECT)
    ),
    sql_pb.SQL_SUPPORTS_LIKE_ESCAPE_CLAUSE: True,
    sql_pb.SQL_SUPPORTS_NON_NULLABLE_COLUMNS: True,
    sql_pb.SQL_OUTER_JOINS_SUPPORT_LEVEL: _Int32(sql_pb.SQL_FULL_OUTER_JOINS),
    sql_pb.SQL_SCHEMA_TERM: "namespace",
    sql_pb.SQL_PROCEDURE_TERM: "",
    sql_pb.SQL_CATALOG_TERM: "catalog",
    sql_pb.SQL_CATALOG_AT_START: True,
    sql_pb.SQL_SELECT_FOR_UPDATE_SUPPORTED: False,
    sql_pb.SQL_STORED_PROCEDURES_SUPPORTED: False,
    sql_pb.SQL_SUPPORTED_SUBQUERIES: _Int32(
        (1 << sql_pb.SQL_SUBQUERIES_IN_COMPARISONS)
        | (1 << sql_pb.SQL_SUBQUERIES_IN_EXISTS)
        | (1 << sql_pb.SQL_SUBQUERIES_IN_INS)
        | (1 << sql_pb.SQL_SUBQUERIES_IN_QUANTIFIEDS)
    ),
    sql_pb.SQL_CORRELATED_SUBQUERIES_SUPPORTED: True,
    sql_pb.SQL_SUPPORTED_UNIONS: _Int32((1 << sql_pb.SQL_UNION) | (1 << sql_pb.SQL_UNION_ALL)),
    sql_pb.SQL_TRANSACTIONS_SUPPORTED: False,
    sql_pb.SQL_BATCH_UPDATES_SUPPORTED: False,
    sql_pb.SQL_SAVEPOINTS_SUPPORTED: False,
    sql_pb.SQL_NAMED_PARAMETERS_SUPPORTED: False,
    sql_pb.SQL_LOCATORS_UPDATE_COPY: False,
    sql_pb.SQL_STORED_FUNCTIONS_USING_CALL_SYNTAX_SUPPORTED: False,
}


def _type_code(value: SqlInfoValue) -> int:
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, _Int32):
        return _INT32
    if isinstance(value, int):
        return _BIGINT
    if isinstance(value, str):
        return _STRING
    if isinstance(value, list):
        return _STRING_LIST
    return _INT32_MAP


def sql_info_batch(
    requested: Sequence[int] | None = None,
    values: Mapping[int, SqlInfoValue] = SQL_INFO,
) -> pa.RecordBatch:
    """One row per requested info id Lake knows (all of them if none requested)."""
    ids: Iterable[int] = requested if requested else sorted(values)
    names: list[int] = []
    codes: list[int] = []
    offsets: list[int] = []
    children: list[list[object]] = [[] for _ in _VALUE_FIELDS]
    for info in dict.fromkeys(ids):  # keep order, drop repeats
        if info not in values:
            continue
        value = values[info]
        code = _type_code(value)
        names.append(info)
        codes.append(code)
        offsets.append(len(children[code]))
        children[code].append(list(value.items()) if isinstance(value, dict) else value)
    arrays = [pa.array(c, type=f.type) for c, f in zip(children, _VALUE_FIELDS, strict=True)]
    union = pa.UnionArray.from_dense(
        pa.array(codes, type=pa.int8()),
        pa.array(offsets, type=pa.int32()),
        arrays,
        [f.name for f in _VALUE_FIELDS],
        list(range(6)),
    )
    return pa.RecordBatch.from_arrays(
        [pa.array(names, type=pa.uint32()), union], schema=SQL_INFO_SCHEMA
    )
