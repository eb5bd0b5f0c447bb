"""Arrow schemas on the wire and at the command line."""

from __future__ import annotations

import base64

import pyarrow as pa

from lake_core.errors import InvalidSchema, SchemaMismatch
from lake_core.filetype import FILE_STRUCT, file_field, is_file_field
from lake_core.names import validate_identifier

__all__ = [
    "COLUMN_TYPES",
    "SAME_VALUES",
    "arriving_schema",
    "check_exact_schema",
    "parse_column_spec",
    "schema_from_base64",
    "schema_from_ipc",
    "schema_to_base64",
    "schema_to_ipc",
    "validate_table_schema",
]

MAX_COLUMNS = 1024

COLUMN_TYPES: dict[str, pa.DataType] = {
    "utf8": pa.utf8(),
    "string": pa.utf8(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "binary": pa.binary(),
    "file": FILE_STRUCT,
}


def schema_to_ipc(schema: pa.Schema) -> bytes:
    data: bytes = schema.serialize().to_pybytes()
    return data


def schema_from_ipc(data: bytes) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidSchema(f"not an Arrow IPC schema: {exc}") from None


def schema_to_base64(schema: pa.Schema) -> str:
    return base64.b64encode(schema_to_ipc(schema)).decode("ascii")


def schema_from_base64(text: str) -> pa.Schema:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise InvalidSchema("schema is not valid base64") from None
    return schema_from_ipc(raw)


def parse_column_spec(spec: str) -> pa.Field:
    """Parse ``name:type`` (types: see COLUMN_TYPES) into a field."""
    name, sep, type_name = spec.partition(":")
    if not sep:
        raise InvalidSchema(f"column {spec!r} must be written name:type")
    validate_identifier(name, "column name")
    type_name = type_name.strip().lower()
    if type_name == "file":
        return file_field(name)
    if type_name not in COLUMN_TYPES:
        known = ", ".join(sorted(COLUMN_TYPES))
        raise InvalidSchema(f"column {name!r} has unknown type {type_name!r}; known: {known}")
    return pa.field(name, COLUMN_TYPES[type_name])


def validate_table_schema(schema: pa.Schema) -> pa.Schema:
    """Reject schemas Lake cannot store as a table."""
    if len(schema) == 0:
        raise InvalidSchema("a table needs at least one column")
    if len(schema) > MAX_COLUMNS:
        raise InvalidSchema(f"a table has at most {MAX_COLUMNS} columns")
    seen: set[str] = set()
    for field in schema:
        validate_identifier(field.name, "column name")
        if field.name in seen:
            raise InvalidSchema(f"column {field.name!r} appears twice")
        seen.add(field.name)
        if is_file_field(field) and field.type != FILE_STRUCT:
            raise InvalidSchema(f"FILE column {field.name!r} has the wrong struct layout")
    return schema


def _describe(field: pa.Field) -> str:
    kind = "file" if is_file_field(field) else str(field.type)
    return f"{field.name}: {kind}{'' if field.nullable else ' not null'}"


def check_exact_schema(expected: pa.Schema, actual: pa.Schema, table: object) -> None:
    """Raise SchemaMismatch unless ``actual`` has exactly the table's columns.

    Names, order, types, nullability and the FILE marker must all agree;
    schema-level metadata (pandas and friends add it) is ignored.
    """
    if len(expected) != len(actual):
        raise SchemaMismatch(
            f"append to {table} has {len(actual)} columns, the table has {len(expected)}"
        )
    for want, got in zip(expected, actual, strict=True):
        same = (
            want.name == got.name
            and want.type.equals(got.type, check_metadata=False)
            and want.nullable == got.nullable
            and is_file_field(want) == is_file_field(got)
        )
        if not same:
            raise SchemaMismatch(
                f"append to {table}: column ({_describe(got)}) does not match "
                f"the table's ({_describe(want)})"
            )


#: Other layouts of the same values, as pandas (large_string) and polars (string_view)
#: produce them: a bulk ingest takes them (over ADBC a client cannot choose), and the
#: SDK casts them to the table's before it sends (``append_batches`` keeps the
#: specification's exact schema).
SAME_VALUES: dict[pa.DataType, tuple[pa.DataType, ...]] = {
    pa.utf8(): (pa.large_utf8(), pa.string_view()),
    pa.binary(): (pa.large_binary(), pa.binary_view()),
}


def arriving_schema(expected: pa.Schema, actual: pa.Schema, table: object) -> pa.Schema | None:
    """None if ``actual`` is exactly the table's schema; else the schema to cast arriving
    batches to (the table's), where each difference only spells the same values.

    Accepted: a string or binary column in another layout (``large_string``,
    ``string_view``, ...), or dictionary-encoded; a column declared nullable
    where the table's is not (its values are checked for nulls:
    :func:`lake_core.values.check_not_null`), or the reverse. FILE columns and
    everything else must match exactly (:func:`check_exact_schema` says what differs).
    """
    if len(expected) == len(actual) and all(
        _same_values(want, got) for want, got in zip(expected, actual, strict=True)
    ):
        if all(
            want.type.equals(got.type, check_metadata=False) and want.nullable == got.nullable
            for want, got in zip(expected, actual, strict=True)
        ):
            return None
        return expected
    check_exact_schema(expected, actual, table)
    return None


def _same_values(want: pa.Field, got: pa.Field) -> bool:
    if want.name != got.name or is_file_field(want) != is_file_field(got):
        return False
    if is_file_field(want):
        return bool(want.type.equals(got.type)) and want.nullable == got.nullable
    kind = got.type.value_type if pa.types.is_dictionary(got.type) else got.type
    return kind.equals(want.type) or kind in SAME_VALUES.get(want.type, ())
