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


def _render(expr: Any, schema: pa.Schema) -> str:
    node = expr.to_variant()
    if isinstance(node, BinaryExpr):
        op = node.op()
        if op in _LOGICAL:
            return f"({_render(node.left(), schema)}) {op} ({_render(node.right(), schema)})"
        if op in _COMPARISONS:
            return f"{_operand(node.left(), schema)} {op} {_operand(node.right(), schema)}"
        raise _Unrenderable(op)
    if isinstance(node, InList):
        values = [_literal(item) for item in node.list()]
        if not values:
            raise _Unrenderable("empty IN list")
        negation = "NOT " if node.negated() else ""
        return f"{_column(node.expr(), schema)} {negation}IN ({', '.join(values)})"
    if isinstance(node, Column):  # a boolean column as the predicate itself
        if not pa.types.is_boolean(_field(node.name(), schema).type):
            raise _Unrenderable("non-boolean predicate")
        return _column(expr, schema)
    if isinstance(node, Not):
        return f"NOT ({_render(node.expr(), schema)})"
    if isinstance(node, IsNull):
        return f"{_column(node.expr(), schema)} IS NULL"
    if isinstance(node, IsNotNull):
        return f"{_column(node.expr(), schema)} IS NOT NULL"
    raise _Unrenderable(type(node).__qualname__)


def _operand(expr: Any, schema: pa.Schema) -> str:
    node = expr.to_variant()
    if isinstance(node, Column):
        return _column(expr, schema)
    if isinstance(node, Literal):
        return _literal(expr)
    raise _Unrenderable(type(node).__qualname__)


def _field(name: str, schema: pa.Schema) -> pa.Field:
    index = schema.get_field_index(name)
    if index < 0:
        raise _Unrenderable(name)
    return schema.field(index)


def _column(expr: Any, schema: pa.Schema) -> str:
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
    if not plain or "`" in name:
        raise _Unrenderable(name)
    return f"`{name}`"


def _literal(expr: Any) -> str:
    if not isinstance(expr.to_variant(), Literal):
        raise _Unrenderable("not a literal")
    scalar = expr.python_value()
    if not isinstance(scalar, pa.Scalar) or not scalar.is_valid:
        raise _Unrenderable("NULL literal")
    data_type, value = scalar.type, scalar.as_py()
    if pa.types.is_boolean(data_type):
        return "true" if value else "false"
    if pa.types.is_integer(data_type):
        return str(int(value))
    if pa.types.is_floating(data_type) and math.isfinite(value):
        return repr(float(value))
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "'" + str(value).replace("'", "''") + "'"
    raise _Unrenderable(str(data_type))
