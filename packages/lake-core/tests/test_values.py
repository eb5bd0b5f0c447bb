"""Values that would change meaning in their column type are refused, by row and column.

Every numeric Arrow type, at its edges: what is accepted converts without a
change of meaning; what is refused is exactly what Arrow would truncate,
wrap or overflow to infinity.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from lake_core.errors import InvalidAppend
from lake_core.values import check_batches, check_values, integer_range

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
