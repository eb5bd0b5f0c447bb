"""The SDK refuses, before sending, insert values that would change meaning in the column."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from lake_core.errors import InvalidAppend
from lake_core.names import TableRef
from lake_sdk._appends import validate_append as _validate_append
from lake_sdk._inserts import parse_insert, plan_insert

SCHEMA = pa.schema(
    [pa.field("i64", pa.int64()), pa.field("i32", pa.int32()), pa.field("f32", pa.float32())]
)
INSERT = parse_insert("INSERT INTO ns.t (i64, i32, f32) VALUES (?, ?, ?)")


@pytest.mark.parametrize(
    ("row", "column", "why"),
    [
        ([1.5, 0, 0.0], "i64", "fractional"),
        ([2.9, 0, 0.0], "i64", "fractional"),
        ([0, 2**31, 0.0], "i32", "range"),
        ([0, -(2**31) - 1, 0.0], "i32", "range"),
        ([0, 0, 1e39], "f32", "overflows"),
        ([math.nan, 0, 0.0], "i64", "finite"),
    ],
)
def test_value_changing_inserts_are_refused_naming_row_and_column(
    row: list[object], column: str, why: str
) -> None:
    rows = [[1, 2, 0.5], [3, 4, 0.25], row]
    with pytest.raises(InvalidAppend, match=f"row 2, column '{column}' of ns.t: .*{why}"):
        plan_insert(INSERT, SCHEMA, rows)


def test_rounding_to_float32_and_whole_floats_are_accepted() -> None:
    plan = plan_insert(INSERT, SCHEMA, [[3.0, -(2**31), 0.1], [2**63 - 1, 2**31 - 1, 3.4e38]])
    assert plan.arrays["i64"].to_pylist() == [3, 2**63 - 1]
    assert plan.arrays["f32"][0].as_py() == pytest.approx(0.1)


def test_append_batches_names_a_value_changing_column_before_sending() -> None:
    table = TableRef("ns", "t")
    good = pa.record_batch(
        [pa.array([1]), pa.array([1], pa.int32()), pa.array([0.5], pa.float32())], schema=SCHEMA
    )
    wrong = pa.record_batch(
        [pa.array([1.0, 2.5]), pa.array([1, 2], pa.int32()), pa.array([0.5, 1.5], pa.float32())],
        names=SCHEMA.names,
    )
    with pytest.raises(InvalidAppend, match=r"row 2, column 'i64' of ns\.t: 2\.5 .*fractional"):
        _validate_append(table, SCHEMA, [good, wrong])


TIMES = pa.schema([pa.field("id", pa.int64()), pa.field("at", pa.timestamp("us", tz="UTC"))])
TIMES_INSERT = parse_insert("INSERT INTO ns.t (id, at) VALUES (?, ?)")


@pytest.mark.parametrize("value", [1.5, 1700000000.9, 2.0])
def test_a_float_into_a_timestamp_is_refused_like_a_fractional_integer(value: float) -> None:
    with pytest.raises(InvalidAppend, match=r"row 1, column .at. of ns\.t: .*not a time"):
        plan_insert(TIMES_INSERT, TIMES, [[1, None], [2, value]])


def test_datetimes_into_a_timestamp_keep_their_instant() -> None:
    from datetime import UTC, datetime, timedelta, timezone

    aware = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    naive = datetime(2026, 1, 1, 12)  # read as UTC (docs/sdk.md)
    batch = plan_insert(TIMES_INSERT, TIMES, [[1, aware], [2, naive]]).build({})
    assert batch.column("at").to_pylist() == [
        datetime(2026, 1, 1, 10, tzinfo=UTC),
        datetime(2026, 1, 1, 12, tzinfo=UTC),
    ]
