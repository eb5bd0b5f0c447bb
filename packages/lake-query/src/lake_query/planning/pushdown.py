"""DataFusion filter expressions as Lance filter SQL, for Lance's own scanner.

When a query is a filtered scan of one table, Lance can answer it alone,
using its scalar indexes, several times faster than the same scan through
DataFusion's table provider. DataFusion has already pushed the WHERE clause
into the scan as exact filters; this module renders them as the SQL text
Lance's scanner takes, which keeps SQL's own NULL semantics.

(Arrow compute expressions would reach Lance as Substrait, and Lance cannot
decode the schema of a table whose types Substrait only knows as extensions,
such as the unsigned integers inside a FILE column.)

Only a small, well-understood subset is rendered: columns, integer, float,
boolean and string literals, comparisons, AND/OR/NOT, IN lists and IS [NOT]
NULL. Anything else returns None and the query runs through DataFusion
unchanged: a missing rendering costs speed, never correctness.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from datafusion.expr import BinaryExpr, Column, InList, IsNotNull, IsNull, Literal, Not

__all__ = ["to_lance_filter"]

_COMPARISONS = frozenset({"=", "!=", "<", "<=", ">", ">="})
_LOGICAL = frozenset({"AND", "OR"})


class _Unrenderable(Exception):
    """An expression outside the rendered subset."""


def to_lance_filter(filters: Sequence[Any], schema: pa.Schema) -> str | None:
    """All of ``filters`` (DataFusion exprs, implicitly AND'ed) as one Lance filter, or None."""
    if not filters:
        return None
    try:
        return " AND ".join(f"({_render(f, schema)})" for f in filters)
    except _Unrenderable:
        return None
    except ValueError:  # an expression the bindings cannot convert (a UDF call, ...)
        return None


def _render(expr: Any, schema: pa.Schema) -> str:
    node = expr.to_variant()
    if isinstance(node, BinaryExpr):
        op = node.op()
        if op in _LOGICAL:
            return f"({_render(node.left(), schema)}) {op} ({_render(node.right(), schema)})"
        if op in _COMPARISONS:
            return _comparison(node.left(), op, node.right(), schema)
        raise _Unrenderable(op)
    if isinstance(node, InList):
        column, data_type = _column(node.expr(), schema)
        values = [_literal(item, data_type) for item in node.list()]
        if not values:
            raise _Unrenderable("empty IN list")
        negation = "NOT " if node.negated() else ""
        return f"{column} {negation}IN ({', '.join(values)})"
    if isinstance(node, Column):  # a boolean column as the predicate itself
        column, data_type = _column(expr, schema)
        if not pa.types.is_boolean(data_type):
            raise _Unrenderable("non-boolean predicate")
        return column
    if isinstance(node, Not):
        return f"NOT ({_render(node.expr(), schema)})"
    if isinstance(node, IsNull):
        return f"{_column(node.expr(), schema)[0]} IS NULL"
    if isinstance(node, IsNotNull):
        return f"{_column(node.expr(), schema)[0]} IS NOT NULL"
    raise _Unrenderable(type(node).__qualname__)


def _comparison(left: Any, op: str, right: Any, schema: pa.Schema) -> str:
    """``column op literal`` (either way round); nothing else is rendered.

    Two columns are not: DataFusion would compare them in a common type that
    Lance's filter does not necessarily choose.
    """
    if isinstance(left.to_variant(), Column):
        column, data_type = _column(left, schema)
        return f"{column} {op} {_literal(right, data_type)}"
    column, data_type = _column(right, schema)
    return f"{_literal(left, data_type)} {op} {column}"


def _field(name: str, schema: pa.Schema) -> pa.Field:
    index = schema.get_field_index(name)
    if index < 0:
        raise _Unrenderable(name)
    return schema.field(index)


def _column(expr: Any, schema: pa.Schema) -> tuple[str, pa.DataType]:
    node = expr.to_variant()
    if not isinstance(node, Column):
        raise _Unrenderable("not a column")
    name = node.name()
    data_type = _field(name, schema).type
    plain = (
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
    )
    if not plain or "`" in name or pa.types.is_float16(data_type):
        raise _Unrenderable(name)
    return f"`{name}`", data_type


def _literal(expr: Any, column_type: pa.DataType) -> str:
    """A literal as Lance filter SQL, only when comparing it in the column's own type
    gives what DataFusion gives comparing both in their common type."""
    if not isinstance(expr.to_variant(), Literal):
        raise _Unrenderable("not a literal")
    scalar = expr.python_value()
    if not isinstance(scalar, pa.Scalar) or not scalar.is_valid:
        raise _Unrenderable("NULL literal")
    data_type, value = scalar.type, scalar.as_py()
    if pa.types.is_boolean(column_type):
        if not pa.types.is_boolean(data_type):
            raise _Unrenderable("boolean column, other literal")
        return "true" if value else "false"
    if pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
        if not (pa.types.is_string(data_type) or pa.types.is_large_string(data_type)):
            raise _Unrenderable("string column, other literal")
        return "'" + str(value).replace("'", "''") + "'"
    if pa.types.is_integer(column_type):
        # Lance casts the literal to the column type: a fractional or
        # out-of-range literal would be refused or changed by that cast.
        if not pa.types.is_integer(data_type) or not _fits(int(value), column_type):
            raise _Unrenderable("integer column, literal outside its type")
        if int(value) == -(2**63):
            # Lance's parser reads it as -(2**63 as a float), which it then refuses.
            raise _Unrenderable("the smallest int64")
        return str(int(value))
    if pa.types.is_floating(column_type):
        return _float_literal(data_type, value, column_type)
    raise _Unrenderable(str(column_type))


def _fits(value: int, column_type: pa.DataType) -> bool:
    bits = column_type.bit_width
    if pa.types.is_signed_integer(column_type):
        return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)
    return 0 <= value < 2**bits


def _float_literal(data_type: pa.DataType, value: Any, column_type: pa.DataType) -> str:
    """A float column's literal, only when exactly representable in the column type.

    DataFusion widens a float32 column to the literal's float64 (exactly),
    Lance narrows the literal to float32: the two agree exactly when the
    narrowing is exact. Zero is left out (-0.0 and 0.0 order differently
    under a total order), and so are NaN and the infinities.
    """
    if pa.types.is_integer(data_type):
        number = float(int(value))
        if int(number) != int(value):
            raise _Unrenderable("integer literal not exact as a float")
    elif pa.types.is_floating(data_type) and not pa.types.is_float16(data_type):
        number = float(value)
    else:
        raise _Unrenderable("float column, other literal")
    if not math.isfinite(number) or number == 0.0:
        raise _Unrenderable("non-finite or zero float literal")
    if pa.types.is_float32(column_type):
        try:
            narrowed = struct.unpack("<f", struct.pack("<f", number))[0]
        except OverflowError:  # beyond float32: Lance would compare with infinity
            raise _Unrenderable("float literal beyond float32") from None
        if narrowed != number:
            raise _Unrenderable("float literal not exact as float32")
    return repr(number)
