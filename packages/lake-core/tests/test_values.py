"""Values that would change meaning in their column type are refused, by row and column.

Every numeric Arrow type, at its edges: what is accepted converts without a
change of meaning; what is refused is exactly what Arrow would truncate,
wrap or overflow to infinity.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from fractions import Fraction
from numbers import Integral
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lake_core.errors import InvalidAppend
from lake_core.values import check_batches, check_not_null, check_values, integer_range

SIGNED = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
INTEGERS = [*SIGNED, pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
F32_MAX = float(np.finfo(np.float32).max)
F16_MAX = 65504.0


def refused(kind: pa.DataType, value: object, row: int = 3) -> str:
    field = pa.field("c", kind)
    values = [None] * row + [value]
    with pytest.raises(InvalidAppend) as caught:
        check_values("ns.t", field, values)
    message = str(caught.value)
    assert message.startswith(f"row {row}, column 'c' of ns.t: "), message
    return message


def accepted(kind: pa.DataType, value: object) -> None:
    check_values("ns.t", pa.field("c", kind), [value])


@pytest.mark.parametrize("kind", INTEGERS, ids=str)
def test_integer_columns_take_whole_numbers_in_range_only(kind: pa.DataType) -> None:
    low, high = integer_range(kind)
    for value in (low, high, 0, float(low), 3.0, -0.0, np.int8(7), Decimal("42"), Fraction(8, 2)):
        if isinstance(value, float) and value == 0 and low == 0:
            continue
        accepted(kind, value)
        # What is accepted, Arrow stores unchanged.
        assert pa.array([value], kind)[0].as_py() == int(value)
    for value in (1.5, 2.9, -0.5, 1e-300, np.float64(0.5), Decimal("1.25"), Fraction(1, 3)):
        assert "fractional" in refused(kind, value)
    for value in (math.nan, math.inf, -math.inf, Decimal("NaN"), Decimal("Infinity")):
        assert "finite" in refused(kind, value)
    for value in (low - 1, high + 1, float(high) * 2, 2**64, -(2**63) - 1):
        if low <= value <= high:
            continue
        assert "outside the column's range" in refused(kind, value)


def test_float32_refuses_overflow_to_infinity_and_keeps_rounding() -> None:
    for value in (0.1, 1 / 3, F32_MAX, -F32_MAX, 3.4028235677973362e38, 1e-50, -0.0):
        accepted(pa.float32(), value)
        assert math.isfinite(pa.array([value], pa.float32())[0].as_py())
    for value in (math.nan, math.inf, -math.inf, Decimal("NaN")):
        accepted(pa.float32(), value)  # non-finite values are stored as they are
    for value in (1e39, -1e39, 3.4028235677973366e38, 1e300, 10**39, Decimal("1e39")):
        assert "overflows" in refused(pa.float32(), value)


def test_float16_and_float64_edges() -> None:
    for value in (F16_MAX, 65519.99, -F16_MAX, 0.1):
        accepted(pa.float16(), value)
    for value in (65520.0, -65520.0, 1e5):
        assert "overflows" in refused(pa.float16(), value)
    for value in (1.7976931348623157e308, 1e-320, 10**308):
        accepted(pa.float64(), value)
    for value in (10**400, Decimal("1e400")):
        assert "overflows" in refused(pa.float64(), value)


def test_other_columns_and_non_numbers_are_left_to_arrow() -> None:
    accepted(pa.utf8(), 1.5)
    accepted(pa.int64(), "7")  # Arrow's own conversion refuses a string
    accepted(pa.int64(), True)  # and a bool


def schema_of(kind: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field("id", pa.int64()), pa.field("c", kind)])


def batch(values: pa.Array) -> pa.RecordBatch:
    ids = pa.array(range(len(values)), pa.int64())
    return pa.record_batch([ids, values], names=["id", "c"])


@pytest.mark.parametrize("kind", INTEGERS, ids=str)
def test_arrow_columns_of_another_type_are_checked_by_row(kind: pa.DataType) -> None:
    low, high = integer_range(kind)
    table = schema_of(kind)
    fine = [
        batch(pa.array([float(low), 0.0, 3.0, None], pa.float64())),
        batch(pa.array([0, 1, None], pa.int8())),
        batch(pa.array([0, min(high, 2**63 - 1)], pa.int64())),
    ]
    check_batches("ns.t", table, fine)
    bad = [
        (pa.array([1.0, 2.0, 1.5], pa.float64()), "fractional"),
        (pa.array([1.0, None, math.nan], pa.float32()), "finite"),
        (pa.array([0.0, 1.0, float(high) + 2**12 + 1.0], pa.float64()), "range"),
        (pa.array([0, 1, 2**64 - 1], pa.uint64()), "range"),
        (pa.array([0, 1, -1], pa.int8()), "range"),
    ]
    for values, why in bad:
        if why == "range" and values.type == pa.int8() and low < 0:
            continue  # -1 fits every signed type
        if why == "range" and values.type == pa.uint64() and kind == pa.uint64():
            continue  # the exact type is never looked at
        with pytest.raises(InvalidAppend, match=f"row 12, column 'c' of ns.t: .*{why}"):
            # Rows count across batches, from first_row.
            check_batches("ns.t", table, [fine[2], batch(values)], first_row=8)


def test_arrow_float_columns_overflowing_float32() -> None:
    table = schema_of(pa.float32())
    check_batches("ns.t", table, [batch(pa.array([0.1, F32_MAX, math.inf, math.nan, None]))])
    check_batches("ns.t", table, [batch(pa.array([1, 2**62], pa.int64()))])
    with pytest.raises(InvalidAppend, match=r"row 1, column 'c' .*overflows"):
        check_batches("ns.t", table, [batch(pa.array([0.1, -1e39]))])
    with pytest.raises(InvalidAppend, match=r"row 0, column 'c' .*overflows"):
        check_batches("ns.t", schema_of(pa.float16()), [batch(pa.array([70000], pa.int32()))])
    # A column of the table's exact type holds its values as they are.
    check_batches("ns.t", table, [batch(pa.array([math.inf], pa.float32()))])


# -- every Python input type the SDK's insert accepts, into every column type ------------

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
COLUMNS = [
    pa.int8(),
    pa.int64(),
    pa.uint8(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
    pa.bool_(),
    pa.utf8(),
    pa.large_utf8(),
    pa.binary(),
    pa.decimal128(10, 2),
    *(pa.timestamp(unit, tz="UTC") for unit in ("s", "ms", "us", "ns")),
    pa.timestamp("us"),
    pa.date32(),
    pa.time32("s"),
    pa.time64("us"),
    pa.duration("s"),
    pa.duration("us"),
    pa.list_(pa.int64()),
]
INPUTS: list[object] = [
    7,
    True,
    1.5,
    2.0,
    1700000000.9,
    np.int64(3),
    np.float64(0.25),
    Decimal("1.25"),
    Decimal("4"),
    Fraction(1, 2),
    "12",
    "2026-01-01",
    b"ab",
    dt.datetime(2026, 1, 1, 12, 0, 0, 500000, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.datetime(2026, 1, 1, 12, 0, 0),
    dt.datetime(2026, 1, 1, 12, 0, 0, 1, tzinfo=UTC),
    dt.date(2026, 1, 2),
    dt.time(1, 2, 3),
    dt.time(1, 2, 3, 400),
    dt.timedelta(seconds=90),
    dt.timedelta(microseconds=1500),
    [1, 2],
]


def _units(kind: pa.DataType) -> int:
    return PER_SECOND[kind.unit]


def _kept(value: object, stored: pa.Array, kind: pa.DataType) -> bool:
    """Whether the one value Arrow stored means what the caller's ``value`` meant."""
    got = stored[0].as_py() if not pa.types.is_temporal(kind) else None
    if pa.types.is_integer(kind) or pa.types.is_decimal(kind) or pa.types.is_boolean(kind):
        return bool(got == value)
    if pa.types.is_floating(kind):
        narrow = {16: np.float16, 32: np.float32, 64: np.float64}[kind.bit_width]
        return bool(got == float(narrow(float(value))))  # type: ignore[arg-type]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return bool(got == (value.decode() if isinstance(value, bytes) else value))
    if pa.types.is_binary(kind):
        return bool(got == (value.encode() if isinstance(value, str) else value))
    if pa.types.is_list(kind):
        return bool(got == value)
    # The stored count of the column's unit (its raw integer).
    count = stored.view(pa.int32() if kind.bit_width == 32 else pa.int64())[0].as_py()
    if isinstance(value, Integral) and not isinstance(value, bool):
        return bool(count == int(value))  # an integer is a count of the column's unit
    if pa.types.is_timestamp(kind) and isinstance(value, dt.datetime):
        # A naive datetime means UTC (docs/sdk.md), as Arrow reads it.
        instant = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        micros = (instant - EPOCH) // dt.timedelta(microseconds=1)
        return bool(count * 1_000_000 == micros * _units(kind))
    if pa.types.is_date(kind) and isinstance(value, dt.date):
        return bool(count == (value - EPOCH.date()).days)
    if pa.types.is_time(kind) and isinstance(value, dt.time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        return bool(count * 1_000_000 == (micros + value.microsecond) * _units(kind))
    if pa.types.is_duration(kind) and isinstance(value, dt.timedelta):
        micros = value // dt.timedelta(microseconds=1)
        return bool(count * 1_000_000 == micros * _units(kind))
    return False  # stored, but not as anything the value meant


@pytest.mark.parametrize("kind", COLUMNS, ids=str)
def test_every_python_input_keeps_its_meaning_or_is_refused(kind: pa.DataType) -> None:
    """The SDK's insert: check_values, then Arrow's conversion; a silent change is a failure."""
    outcomes: dict[str, str] = {}
    for value in INPUTS:
        try:
            check_values("ns.t", pa.field("c", kind), [value])
        except InvalidAppend:
            outcomes[repr(value)] = "refused"
            continue
        try:
            stored = pa.array([value], kind)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            outcomes[repr(value)] = "refused by Arrow"  # the SDK raises InvalidArgument
            continue
        assert _kept(value, stored, kind), f"{value!r} into {kind} silently became {stored[0]}"
        outcomes[repr(value)] = "kept"
    assert "kept" in outcomes.values()


def test_floats_into_temporal_columns_are_refused_like_fractional_integers() -> None:
    for kind in (pa.timestamp("us", tz="UTC"), pa.date32(), pa.time64("us"), pa.duration("s")):
        for value in (1.5, 1700000000.9, 2.0, Decimal("3.5"), np.float64(1.0)):
            assert "fractional number, not a time" in refused(kind, value)
    assert "more precise than the column's unit (s)" in refused(
        pa.timestamp("s", tz="UTC"), dt.datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)
    )
    assert "a date column holds dates" in refused(pa.date32(), dt.datetime(2026, 1, 1, 12))
    assert "not a list" in refused(pa.list_(pa.int64()), b"ab")
    accepted(pa.timestamp("us", tz="UTC"), dt.datetime(2026, 1, 1, tzinfo=UTC))
    accepted(pa.timestamp("us", tz="UTC"), 1_700_000_000_000_000)  # a count of microseconds


def test_arrow_columns_of_another_type_never_convert_into_a_timestamp() -> None:
    from lake_core.errors import SchemaMismatch
    from lake_core.schemas import check_exact_schema

    table = schema_of(pa.timestamp("us", tz="UTC"))
    for values in (pa.array([1.5, 1700000000.9]), pa.array([1, 2]), pa.array(["2026-01-01"])):
        check_batches("ns.t", table, [batch(values)])  # not numeric into numeric: no row check
        with pytest.raises(SchemaMismatch):
            check_exact_schema(table, batch(values).schema, "ns.t")


_STRICT = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field(
            "s",
            pa.struct([pa.field("a", pa.int32(), nullable=False), pa.field("b", pa.string())]),
        ),
        pa.field("l", pa.list_(pa.field("item", pa.float32(), nullable=False))),
        pa.field("f", pa.list_(pa.field("item", pa.int8(), nullable=False), 2)),
    ]
)


def _strict_batch(
    ids: list[Any], s: list[Any], items: list[Any], pairs: list[Any]
) -> pa.RecordBatch:
    columns = [
        pa.array(values, field.type)
        for values, field in zip((ids, s, items, pairs), _STRICT, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_STRICT)


def test_check_not_null_names_the_row_of_a_null_a_field_refuses() -> None:
    good = _strict_batch([1, 2], [{"a": 1, "b": None}, None], [[1.0], None], [[1, 2], None])
    check_not_null("t", _STRICT, [good])
    bad = {
        "id": _strict_batch([1, None], [None, None], [None, None], [None, None]),
        "s": _strict_batch([1, 2], [None, {"a": None, "b": "x"}], [None, None], [None, None]),
        "l": _strict_batch([1, 2], [None, None], [[1.0], [2.0, None]], [None, None]),
        "f": _strict_batch([1, 2], [None, None], [None, None], [None, [1, None]]),
    }
    for column, batch in bad.items():
        # Rows count across batches (the good one first).
        with pytest.raises(InvalidAppend, match=rf"row 3, column '{column}' of t"):
            check_not_null("t", _STRICT, [good, batch])
    # A struct that is itself null may hold nulls in its non-nullable children.
    absent = pa.StructArray.from_arrays(
        [pa.array([None], pa.int32()), pa.array([None], pa.string())],
        fields=list(_STRICT.field("s").type),
        mask=pa.array([True]),
    )
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([1], pa.int64()),
            absent,
            pa.array([None], _STRICT.field("l").type),
            pa.array([None], _STRICT.field("f").type),
        ],
        schema=_STRICT,
    )
    check_not_null("t", _STRICT, [batch])
