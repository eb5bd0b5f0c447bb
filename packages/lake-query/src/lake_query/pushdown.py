"""DataFusion filter expressions as pyarrow expressions, for Lance's own scanner.

When a query is a filtered scan of one table, Lance can answer it alone,
using its scalar indexes, several times faster than the same scan through
DataFusion's table provider. DataFusion has already pushed the WHERE clause
into the scan as exact filters; this module translates them into a
:class:`pyarrow.compute.Expression` Lance evaluates with the same meaning.

Only a small, well-understood subset is translated (columns, typed
literals, comparisons, AND/OR/NOT, IN lists, IS [NOT] NULL). Anything else
returns None and the query runs through DataFusion unchanged: a missing
translation costs speed, never correctness.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["to_arrow_filter"]

_COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_LOGICAL: dict[str, Callable[[Any, Any], Any]] = {"AND": operator.and_, "OR": operator.or_}


def _is_plain_type(data_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_boolean(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_large_string(data_type)
        or pa.types.is_timestamp(data_type)
        or pa.types.is_date(data_type)
    )


class _Untranslatable(Exception):
    """An expression outside the translated subset."""


def to_arrow_filter(filters: Sequence[Any], schema: pa.Schema) -> pc.Expression | None:
    """All of ``filters`` (DataFusion exprs, implicitly AND'ed) as one expression, or None."""
    if not filters:
        return None
    try:
        return reduce(operator.and_, (_translate(f, schema) for f in filters))
    except _Untranslatable:
        return None


def _translate(expr: Any, schema: pa.Schema, *, negated: bool = False) -> pc.Expression:
    """``expr`` as Arrow; ``negated`` when under a NOT (see the IN list case)."""
    node = expr.to_variant()
    kind = type(node).__name__
    if kind == "BinaryExpr":
        op = node.op()
        left, right = node.left(), node.right()
        if op in _LOGICAL:
            return _LOGICAL[op](
                _translate(left, schema, negated=negated),
                _translate(right, schema, negated=negated),
            )
        if op in _COMPARISONS:
            return _COMPARISONS[op](_operand(left, schema), _operand(right, schema))
        raise _Untranslatable(op)
    if kind == "InList":
        # Arrow's is_in answers false for a null input where SQL answers NULL;
        # the same under a WHERE, but not once negated.
        if negated or node.negated():
            raise _Untranslatable("negated IN list")
        column = _column(node.expr(), schema)
        values = [_literal(item) for item in node.list()]
        if not values or len({v.type for v in values}) != 1:
            raise _Untranslatable("IN list")
        return column.isin(pa.array([v.as_py() for v in values], type=values[0].type))
    if kind == "Column":  # a boolean column as the predicate itself
        column = _column(expr, schema)
        if not pa.types.is_boolean(schema.field(node.name()).type):
            raise _Untranslatable("non-boolean predicate")
        return column
    if kind == "Not":
        return ~_translate(node.expr(), schema, negated=not negated)
    if kind == "IsNull":
        return _column(node.expr(), schema).is_null()
    if kind == "IsNotNull":
        return _column(node.expr(), schema).is_valid()
    raise _Untranslatable(kind)


def _operand(expr: Any, schema: pa.Schema) -> Any:
    kind = type(expr.to_variant()).__name__
    if kind == "Column":
        return _column(expr, schema)
    if kind == "Literal":
        return pc.scalar(_literal(expr))
    raise _Untranslatable(kind)


def _column(expr: Any, schema: pa.Schema) -> pc.Expression:
    node = expr.to_variant()
    if type(node).__name__ != "Column":
        raise _Untranslatable("not a column")
    name = node.name()
    index = schema.get_field_index(name)
    if index < 0 or not _is_plain_type(schema.field(index).type):
        raise _Untranslatable(name)
    return pc.field(name)


def _literal(expr: Any) -> pa.Scalar:
    if type(expr.to_variant()).__name__ != "Literal":
        raise _Untranslatable("not a literal")
    value = expr.python_value()
    if not isinstance(value, pa.Scalar) or not value.is_valid:
        raise _Untranslatable("NULL literal")  # SQL's NULL comparisons differ from Arrow's
    if not _is_plain_type(value.type):
        raise _Untranslatable(str(value.type))
    return value
