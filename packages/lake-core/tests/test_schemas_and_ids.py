from __future__ import annotations

import pyarrow as pa
import pytest

from lake_core.config import env_int, is_loopback_address
from lake_core.errors import (
    ConfigError,
    InvalidAppend,
    InvalidArgument,
    InvalidSchema,
    SchemaMismatch,
)
from lake_core.filetype import FILE_STRUCT, is_file_field
from lake_core.ids import new_operation_id, operation_time_ms, parse_operation_id
from lake_core.models import DataLocation
from lake_core.schemas import (
    check_exact_schema,
    parse_column_spec,
    schema_from_base64,
    schema_to_base64,
    validate_table_schema,
)


def test_column_specs_cover_every_cli_type() -> None:
    names = ["utf8", "int32", "int64", "float32", "float64", "bool", "timestamp", "binary", "file"]
    fields = [parse_column_spec(f"c{i}:{t}") for i, t in enumerate(names)]
    assert fields[-1].type == FILE_STRUCT
    assert is_file_field(fields[-1])
    schema = validate_table_schema(pa.schema(fields))
    assert schema_from_base64(schema_to_base64(schema)).equals(schema, check_metadata=True)
    with pytest.raises(InvalidSchema, match="unknown type"):
        parse_column_spec("x:decimal")
    with pytest.raises(InvalidSchema, match="name:type"):
        parse_column_spec("x")


def test_exact_schema_check() -> None:
    table = pa.schema([pa.field("a", pa.int64()), parse_column_spec("f:file")])
    check_exact_schema(table, table.with_metadata({"pandas": "x"}), "t")
    with pytest.raises(SchemaMismatch, match="a: int32"):
        check_exact_schema(table, pa.schema([pa.field("a", pa.int32()), table.field("f")]), "t")
    with pytest.raises(SchemaMismatch, match="file"):
        check_exact_schema(table, pa.schema([table.field("a"), pa.field("f", FILE_STRUCT)]), "t")
    with pytest.raises(SchemaMismatch, match="columns"):
        check_exact_schema(table, pa.schema([table.field("a")]), "t")


def test_operation_ids() -> None:
    first, second = new_operation_id(), new_operation_id()
    assert first != second
    assert parse_operation_id(first).version == 7
    assert abs(operation_time_ms(first) - operation_time_ms(second)) < 1000
    for bad in ["", "nope", "00000000-0000-4000-8000-000000000000", first.upper()]:
        with pytest.raises(InvalidAppend):
            parse_operation_id(bad)


def test_env_int_bounds() -> None:
    assert env_int("X", 10, 1, 100, env={}) == 10
    assert env_int("X", 10, 1, 100, env={"X": "42"}) == 42
    for bad in ["0", "101", "ten", "1.5"]:
        with pytest.raises(ConfigError, match="X"):
            env_int("X", 10, 1, 100, env={"X": bad})


def test_loopback_detection() -> None:
    assert is_loopback_address("127.0.0.1:50051")
    assert is_loopback_address("[::1]:50051")
    assert is_loopback_address("localhost:1")
    assert not is_loopback_address("0.0.0.0:50051")
    assert not is_loopback_address("10.1.2.3:50051")


def test_data_location_shape() -> None:
    ok = DataLocation(uri="file:///x", media_type="video/mp4", size_bytes=1, sha256="a" * 64)
    assert ok.size_bytes == 1
    with pytest.raises(InvalidArgument, match="sha256"):
        DataLocation(uri="file:///x", media_type="video/mp4", size_bytes=1, sha256="A" * 64)
