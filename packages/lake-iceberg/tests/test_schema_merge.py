"""Schema merge by field id: additions, promotions, renames, and every violation listed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from lake_iceberg.errors import IcebergUnsupportedType
from lake_iceberg.registrar.schema_merge import check_signed, file_schema, merge_schema

TABLE = Schema(
    NestedField(1, "robot", StringType(), required=False),
    NestedField(2, "speed", IntegerType(), required=False),
    NestedField(3, "temp", FloatType(), required=False),
    schema_id=0,
)


def schema(*fields: NestedField) -> Schema:
    return Schema(*fields)


def test_same_schema_is_nothing_to_do() -> None:
    merged = merge_schema(TABLE, TABLE, next_schema_id=1)
    assert not merged.changed
    assert not merged.violations
    assert merged.schema is TABLE


def test_added_column_keeps_its_id_and_is_optional() -> None:
    segment = schema(*TABLE.fields, NestedField(9, "pose", DoubleType(), required=True))
    merged = merge_schema(TABLE, segment, next_schema_id=4)
    assert merged.changed
    assert merged.schema.schema_id == 4
    added = merged.schema.find_field(9)
    assert (added.name, added.field_type, added.required) == ("pose", DoubleType(), False)


def test_promotions_and_rename_follow_the_id() -> None:
    segment = schema(
        NestedField(1, "robot_id", StringType(), required=False),
        NestedField(2, "speed", LongType(), required=False),
        NestedField(3, "temp", DoubleType(), required=False),
    )
    merged = merge_schema(TABLE, segment, next_schema_id=1)
    assert not merged.violations
    assert [(f.field_id, f.name, f.field_type) for f in merged.schema.fields] == [
        (1, "robot_id", StringType()),
        (2, "speed", LongType()),
        (3, "temp", DoubleType()),
    ]


def test_columns_absent_from_the_segment_stay() -> None:
    segment = schema(NestedField(1, "robot", StringType(), required=False))
    merged = merge_schema(TABLE, segment, next_schema_id=1)
    assert not merged.changed
    assert not merged.violations


def test_every_violation_is_listed_with_path_id_and_both_types() -> None:
    table = schema(
        NestedField(1, "robot", StringType(), required=False),
        NestedField(2, "speed", LongType(), required=False),
        NestedField(3, "temp", DoubleType(), required=False),
        NestedField(
            4, "pose", StructType(NestedField(5, "x", LongType(), required=False)), required=False
        ),
        NestedField(6, "must", StringType(), required=True),
    )
    segment = schema(
        NestedField(1, "robot", IntegerType(), required=False),
        NestedField(2, "speed", IntegerType(), required=False),
        NestedField(3, "temp", FloatType(), required=False),
        NestedField(
            4,
            "pose",
            StructType(NestedField(5, "x", IntegerType(), required=False)),
            required=False,
        ),
    )
    merged = merge_schema(table, segment, next_schema_id=1)
    assert not merged.changed
    assert merged.violations == [
        "robot (field id 1): table string, segment int (incompatible)",
        "speed (field id 2): table long, segment int (narrowing)",
        "temp (field id 3): table double, segment float (narrowing)",
        "pose.x (field id 5): table long, segment int (narrowing)",
        "must (field id 6): required in the table, absent from the segment",
    ]


def test_new_name_clashing_with_another_column_is_a_violation() -> None:
    segment = schema(
        NestedField(1, "robot", StringType(), required=False),
        NestedField(8, "speed", LongType(), required=False),
    )
    merged = merge_schema(TABLE, segment, next_schema_id=1)
    assert merged.violations == ["speed: two columns would share this name"]


def test_nested_struct_gains_a_field() -> None:
    table = schema(
        NestedField(
            4, "pose", StructType(NestedField(5, "x", LongType(), required=False)), required=False
        )
    )
    segment = schema(
        NestedField(
            4,
            "pose",
            StructType(
                NestedField(5, "x", LongType(), required=False),
                NestedField(7, "y", LongType(), required=False),
            ),
            required=False,
        )
    )
    merged = merge_schema(table, segment, next_schema_id=1)
    assert merged.changed
    assert merged.schema.find_field(7).name == "y"


def _arrow(kind: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field("c", kind, metadata={"PARQUET:field_id": "3"})])


@pytest.mark.parametrize("kind", [pa.uint8(), pa.uint32(), pa.uint64(), pa.list_(pa.uint16())])
def test_unsigned_columns_name_the_signed_policy(kind: pa.DataType) -> None:
    with pytest.raises(IcebergUnsupportedType, match="unsigned: signed"):
        check_signed(_arrow(kind), "telemetry")


def test_file_schema_keeps_the_files_ids() -> None:
    converted = file_schema(_arrow(pa.int64()), "telemetry")
    assert [(f.field_id, f.name) for f in converted.fields] == [(3, "c")]
