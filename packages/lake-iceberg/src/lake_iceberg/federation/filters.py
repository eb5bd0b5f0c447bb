"""DataFusion filters as pyiceberg expressions, for pruning data files by statistics.

The pruned scan only drops data files whose manifest statistics prove no row
can match; DataFusion still applies the whole WHERE clause to the rows read.
So a translation may be weaker than the filter (a conjunct it cannot render
is left out), but never stronger. Only a small subset is rendered, where
Iceberg's evaluation of the literal in the column's own type is exactly
DataFusion's: integer literals within an integer column's range, strings
and booleans (never floats: NaN orders differently); comparisons (either
way round), AND, OR, NOT, IN lists and IS [NOT] NULL. Anything else renders
as nothing, which costs pruning, never rows.

One more exception: a column some partition spec truncates as an integer.
Iceberg's truncate of an int or long wraps near its minimum (the spec's
arithmetic in 32 or 64 bits: ``truncate[10](-2**31)`` is ``2**31 - 2``), so a
file holding such values sits in a partition that pruning by value skips;
``v < 10`` and even ``v = -2**31`` lost those rows. Predicates on such a
column render as nothing (:func:`wrapping_columns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from datafusion.expr import BinaryExpr, Column, InList, IsNotNull, IsNull, Literal, Not
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    NotEqualTo,
    NotIn,
    NotNull,
    Or,
)
from pyiceberg.expressions import (
    IsNull as IcebergIsNull,
)
from pyiceberg.expressions import (
    Not as IcebergNot,
)
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import TruncateTransform
from pyiceberg.types import IntegerType, LongType

__all__ = ["to_iceberg_filter", "wrapping_columns"]

_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PREDICATES = {
    "=": EqualTo,
    "!=": NotEqualTo,
    "<": LessThan,
    "<=": LessThanOrEqual,
    ">": GreaterThan,
    ">=": GreaterThanOrEqual,
}


class _Unrendered(Exception):
    pass


def wrapping_columns(metadata: TableMetadata) -> frozenset[str]:
    """Top-level columns any of the table's partition specs truncates as an int or long."""
    names: set[str] = set()
    for spec in metadata.specs().values():
        for field in spec.fields:
            if not isinstance(field.transform, TruncateTransform):
                continue
            for schema in metadata.schemas:  # the source column in any schema it had
                try:
                    source = schema.find_field(field.source_id)
                except ValueError:
                    continue
                if isinstance(source.field_type, IntegerType | LongType):
                    names.add(schema.find_column_name(field.source_id) or source.name)
    return frozenset(name.split(".")[0] for name in names)


def to_iceberg_filter(
    filters: Sequence[Any], schema: pa.Schema, unprunable: frozenset[str] = frozenset()
) -> BooleanExpression:
    """The AND of every conjunct of ``filters`` that renders (AlwaysTrue if none);
    a conjunct naming a column of ``unprunable`` does not."""
    narrowed = pa.schema([f for f in schema if f.name not in unprunable])
    result: BooleanExpression = AlwaysTrue()
    for expr in filters:
        for conjunct in _conjuncts(expr):
            try:
                rendered = _render(conjunct, narrowed)
            except (_Unrendered, ValueError, TypeError):
                continue  # weaker, still safe: DataFusion filters the rows itself
            result = rendered if isinstance(result, AlwaysTrue) else And(result, rendered)
    return result


def _conjuncts(expr: Any) -> list[Any]:
    node = expr.to_variant()
    if isinstance(node, BinaryExpr) and node.op() == "AND":
        return [*_conjuncts(node.left()), *_conjuncts(node.right())]
    return [expr]


def _render(expr: Any, schema: pa.Schema) -> BooleanExpression:
    node = expr.to_variant()
    if isinstance(node, BinaryExpr):
        op = node.op()
        if op == "AND":
            return And(_render(node.left(), schema), _render(node.right(), schema))
        if op == "OR":
            return Or(_render(node.left(), schema), _render(node.right(), schema))
        if op in _PREDICATES:
            left, right = node.left(), node.right()
            if isinstance(left.to_variant(), Column):
                name, kind = _column(left, schema)
                return _PREDICATES[op](name, _literal(right, kind))
            name, kind = _column(right, schema)
            return _PREDICATES[_FLIPPED[op]](name, _literal(left, kind))
        raise _Unrendered(op)
    if isinstance(node, InList):
        name, kind = _column(node.expr(), schema)
        values = {_literal(item, kind) for item in node.list()}
        if not values:
            raise _Unrendered("empty IN")
        return NotIn(name, values) if node.negated() else In(name, values)
    if isinstance(node, Not):
        return IcebergNot(_render(node.expr(), schema))
    if isinstance(node, IsNull):
        return IcebergIsNull(_column(node.expr(), schema)[0])
    if isinstance(node, IsNotNull):
        return NotNull(_column(node.expr(), schema)[0])
    raise _Unrendered(type(node).__qualname__)


def _column(expr: Any, schema: pa.Schema) -> tuple[str, pa.DataType]:
    node = expr.to_variant()
    if not isinstance(node, Column):
        raise _Unrendered("not a column")
    name = node.name()
    index = schema.get_field_index(name)
    if index < 0:
        raise _Unrendered(name)
    return name, schema.field(index).type


def _literal(expr: Any, kind: pa.DataType) -> Any:
    if not isinstance(expr.to_variant(), Literal):
        raise _Unrendered("not a literal")
    scalar = expr.python_value()
    if not isinstance(scalar, pa.Scalar) or not scalar.is_valid:
        raise _Unrendered("NULL literal")
    literal_type, value = scalar.type, scalar.as_py()
    if pa.types.is_boolean(kind) and pa.types.is_boolean(literal_type):
        return bool(value)
    if _is_string(kind) and _is_string(literal_type):
        return str(value)
    if pa.types.is_integer(kind) and pa.types.is_integer(literal_type):
        bits = kind.bit_width
        if pa.types.is_signed_integer(kind) and -(2 ** (bits - 1)) <= int(value) < 2 ** (bits - 1):
            return int(value)
        raise _Unrendered("integer literal outside the column's type")
    # No floats: DataFusion orders NaN above every number (so `x > 1000` holds for
    # NaN), while Iceberg's bounds leave NaN out; pruning by them would lose rows.
    raise _Unrendered(str(kind))


def _is_string(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
    )
