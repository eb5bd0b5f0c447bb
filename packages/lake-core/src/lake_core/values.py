"""Values that would change meaning in their column's type are refused.

Arrow's conversions are lossy where a caller would not expect it: Python's
``1.5`` becomes ``1`` in an ``int64`` column, ``1e39`` becomes ``inf`` in a
``float32`` one, and a ``safe=False`` cast wraps integers around. An append or
insert carrying such a value is refused with :class:`InvalidAppend` naming the
row and the column:

- a fractional (or NaN/infinite) value into an integer column;
- an integer outside the column's range;
- a finite value whose nearest value of the column's float type is infinite;
- a float or decimal number into a timestamp, date, time or duration column
  (Arrow reads ``1700000000.9`` as that many of the column's units, truncated:
  a date in 1970); an integer is taken as a count of the column's unit;
- a datetime, time or timedelta finer than the column's unit (Arrow truncates
  ``12:00:00.5`` to ``12:00:00`` in a seconds column), and a datetime into a
  date column (Arrow drops its time of day);
- a string or bytes into a list column (Arrow reads ``b"ab"`` as ``[97, 98]``).

A naive ``datetime`` (no ``tzinfo``) into a column with a time zone is read as
UTC, as Arrow reads it (not as the machine's local time); ``docs/sdk.md`` says so.

Ordinary rounding to the nearest ``float32`` (or ``float16``) stays allowed:
``0.1`` into ``float32`` is the float32 nearest 0.1, as every engine stores it.

:func:`check_values` checks Python values (the SDK's insert rows) and
:func:`check_batches` Arrow columns whose numeric type differs from the
table's (what a client that did not convert sends); both run before anything
is converted.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Iterable, Sequence
from decimal import Decimal
from numbers import Integral, Rational, Real

import pyarrow as pa
import pyarrow.compute as pc

from lake_core.errors import InvalidAppend

__all__ = ["check_batches", "check_not_null", "check_values", "integer_range"]

#: struct formats that pack a double to the float type, failing on overflow.
_PACK = {16: "<e", 32: "<f"}
#: |x| at or above this rounds to infinity in float32 (ties to even at 2**128).
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
#: |x| at or above this rounds to infinity in float16 (65520 = 65504 + half an ulp).
_FLOAT16_OVERFLOW = 65520.0


def integer_range(kind: pa.DataType) -> tuple[int, int]:
    """The smallest and largest value of an Arrow integer type."""
    bits = kind.bit_width
    if pa.types.is_signed_integer(kind):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _refuse(table: object, field: pa.Field, row: int, value: object, why: str) -> InvalidAppend:
    shown = repr(value)
    if len(shown) > 64:
        shown = shown[:61] + "..."
    return InvalidAppend(
        f"row {row}, column {field.name!r} of {table}: {shown} {why} ({field.type})"
    )


def _integer_problem(value: object, low: int, high: int) -> str | None:
    """Why ``value`` cannot be stored unchanged in an integer column, or None."""
    if isinstance(value, bool) or not isinstance(value, Integral | Real | Decimal):
        return None  # not a number: Arrow's own conversion decides
    if isinstance(value, Integral):
        whole = int(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            return "is not a finite number"
        if value != value.to_integral_value():
            return "has a fractional part; an integer column holds whole numbers"
        whole = int(value)
    elif isinstance(value, Rational):
        if value.denominator != 1:
            return "has a fractional part; an integer column holds whole numbers"
        whole = int(value.numerator)
    else:
        number = float(value)
        if not math.isfinite(number):
            return "is not a finite number"
        if not number.is_integer():
            return "has a fractional part; an integer column holds whole numbers"
        whole = int(number)
    if not low <= whole <= high:
        return f"is outside the column's range {low}..={high}"
    return None


def _float_problem(value: object, bits: int) -> str | None:
    """Why ``value`` would become infinite in a float column of ``bits``, or None."""
    fmt = _PACK.get(bits)
    if isinstance(value, bool) or not isinstance(value, Real | Decimal):
        return None
    if isinstance(value, Decimal) and not value.is_finite():
        return None  # NaN and infinities are stored as they are
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float64
        return "overflows the column's float type to infinity"
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not math.isfinite(number):  # e.g. Decimal("1e400")
        return "overflows the column's float type to infinity"
    if fmt is not None:
        try:
            struct.pack(fmt, number)
        except OverflowError:
            return "overflows the column's float type to infinity"
    return None


#: Sub-unit parts (in microseconds) a value must not have, by the column's unit.
_UNIT_MICROS = {"s": 1_000_000, "ms": 1_000}


def _is_temporal(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_timestamp(kind)
        or pa.types.is_date(kind)
        or pa.types.is_time(kind)
        or pa.types.is_duration(kind)
    )


def _temporal_problem(value: object, kind: pa.DataType) -> str | None:
    """Why ``value`` would change meaning in a timestamp/date/time/duration column, or None."""
    if isinstance(value, bool):
        return "is a bool, not a time"
    if isinstance(value, Real | Decimal) and not isinstance(value, Integral):
        return (
            "is a fractional number, not a time; pass a datetime, date, time or timedelta "
            "(or a whole number of the column's unit)"
        )
    if pa.types.is_date(kind) and isinstance(value, dt.datetime):
        return "is a datetime; a date column holds dates (pass its .date())"
    unit = getattr(kind, "unit", None)
    step = _UNIT_MICROS.get(unit or "", 1)
    if getattr(value, "nanosecond", 0) and unit != "ns":  # a pandas Timestamp
        return f"is more precise than the column's unit ({unit}); round it first"
    if isinstance(value, dt.datetime | dt.time):
        micros = value.microsecond
    elif isinstance(value, dt.timedelta):
        micros = value.microseconds
    else:
        return None
    if micros % step:
        return f"is more precise than the column's unit ({unit}); round it first"
    return None


def check_values(
    table: object, field: pa.Field, values: Iterable[object], *, first_row: int = 0
) -> None:
    """Raise InvalidAppend for the first of ``values`` that would change meaning in ``field``."""
    kind = field.type
    if pa.types.is_integer(kind):
        low, high = integer_range(kind)
        for row, value in enumerate(values, first_row):
            problem = None if value is None else _integer_problem(value, low, high)
            if problem is not None:
                raise _refuse(table, field, row, value, problem)
    elif pa.types.is_floating(kind):
        for row, value in enumerate(values, first_row):
            problem = None if value is None else _float_problem(value, kind.bit_width)
            if problem is not None:
                raise _refuse(table, field, row, value, problem)
    elif _is_temporal(kind):
        for row, value in enumerate(values, first_row):
            problem = None if value is None else _temporal_problem(value, kind)
            if problem is not None:
                raise _refuse(table, field, row, value, problem)
    elif _is_list(kind):
        for row, value in enumerate(values, first_row):
            if isinstance(value, str | bytes | bytearray | memoryview):
                why = f"is a {type(value).__name__}, not a list (Arrow would split it into items)"
                raise _refuse(table, field, row, value, why)


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    index = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if index is None or index < 0 else int(index)


def _array_problem(array: pa.Array, kind: pa.DataType) -> tuple[int, str] | None:
    """The first row of a numeric ``array`` that would change meaning as ``kind``."""
    source = array.type
    if pa.types.is_integer(kind):
        low, high = integer_range(kind)
        if pa.types.is_floating(source):
            as_double = pc.cast(array, pa.float64())
            row = _first(pc.invert(pc.is_finite(as_double)))
            if row is not None:
                return row, "is not a finite number"
            row = _first(pc.not_equal(pc.trunc(as_double), as_double))
            if row is not None:
                return row, "has a fractional part; an integer column holds whole numbers"
            # Doubles compare exactly against these bounds (both are powers of two).
            too_big = pc.greater_equal(as_double, float(high) + 1)
            too_small = pc.less(as_double, float(low))
        elif pa.types.is_integer(source):
            source_low, source_high = integer_range(source)
            # Compare in the source type: each bound checked only lies inside its range.
            too_big = pc.greater(array, pa.scalar(high, source)) if high < source_high else None
            too_small = pc.less(array, pa.scalar(low, source)) if low > source_low else None
        else:
            return None
        found = [_first(mask) for mask in (too_big, too_small) if mask is not None]
        rows = [row for row in found if row is not None]
        if rows:
            return min(rows), f"is outside the column's range {low}..={high}"
        return None
    if pa.types.is_floating(kind) and kind.bit_width in (16, 32):
        if not (pa.types.is_floating(source) or pa.types.is_integer(source)):
            return None
        limit = _FLOAT32_OVERFLOW if kind.bit_width == 32 else _FLOAT16_OVERFLOW
        if source.bit_width <= kind.bit_width and pa.types.is_floating(source):
            return None
        as_double = pc.cast(array, pa.float64(), safe=False)  # only the magnitude matters
        overflow = pc.and_(pc.is_finite(as_double), pc.greater_equal(pc.abs(as_double), limit))
        row = _first(overflow)
        if row is not None:
            return row, "overflows the column's float type to infinity"
    return None


def check_batches(
    table: object,
    table_schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    *,
    first_row: int = 0,
) -> None:
    """Raise InvalidAppend where a numeric column of another type would change meaning.

    Only columns whose type differs from the table's are looked at: a column of
    the table's exact type holds its values as they are. Rows are counted across
    the batches, from ``first_row``.
    """
    fields = {f.name: f for f in table_schema}
    offset = first_row
    for batch in batches:
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            field = fields.get(name)
            if field is None or column.type.equals(field.type):
                continue
            found = _array_problem(column, field.type)
            if found is not None:
                row, why = found
                raise _refuse(table, field, offset + row, column[row].as_py(), why)
        offset += batch.num_rows


def check_not_null(
    table: object,
    table_schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    *,
    first_row: int = 0,
) -> None:
    """Raise InvalidAppend at the first null a non-nullable field of the table holds.

    Nested fields count where their parent value is present (a struct's child,
    a list's items). The batches are in the table's column order (their schema
    checked first). Lance refuses such rows only when it writes them, for a
    whole commit group at once; this refuses the one append, naming the row.
    """
    strict = [(i, field) for i, field in enumerate(table_schema) if _strict(field)]
    if not strict:
        return
    offset = first_row
    for batch in batches:
        for index, field in strict:
            row = _first_null(batch.column(index), field, None)
            if row is not None:
                raise InvalidAppend(
                    f"row {offset + row}, column {field.name!r} of {table}: a null where "
                    f"the table's field does not allow one ({field.type})"
                )
        offset += batch.num_rows


def _strict(field: pa.Field) -> bool:
    """Whether ``field`` or a field nested in it refuses nulls."""
    if not field.nullable:
        return True
    t = field.type
    if pa.types.is_struct(t):
        return any(_strict(t.field(i)) for i in range(t.num_fields))
    if _is_list(t):
        return _strict(t.value_field)
    return False


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _first_null(array: pa.Array, field: pa.Field, live: pa.BooleanArray | None) -> int | None:
    """The first index of ``array`` breaking ``field``'s nullability (counting only
    ``live`` positions when given), or None."""
    if not field.nullable and array.null_count:
        nulls = array.is_null()
        if live is not None:
            nulls = pc.and_(nulls, live)
        found = _first(nulls)
        if found is not None:
            return found
    t = field.type
    if pa.types.is_struct(t) and _strict(field):
        present = array.is_valid() if array.null_count else None
        if live is not None:
            present = live if present is None else pc.and_(present, live)
        for i in range(t.num_fields):
            if _strict(t.field(i)):
                row = _first_null(array.field(i), t.field(i), present)
                if row is not None:
                    return row
    elif _is_list(t) and _strict(t.value_field):
        # flatten() keeps the items of present lists only; live positions were
        # applied above for the lists themselves.
        item = _first_null(array.flatten(), t.value_field, None)
        if item is not None:
            return _list_of_item(array, item)
    return None


def _list_of_item(array: pa.Array, item: int) -> int:
    """The list (row) holding flattened item ``item``: an error path, read row by row."""
    seen = 0
    for row, value in enumerate(array):
        if not value.is_valid:
            continue
        size = len(value.values)
        if item < seen + size:
            return row
        seen += size
    return max(len(array) - 1, 0)
