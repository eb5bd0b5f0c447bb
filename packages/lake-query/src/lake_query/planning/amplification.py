"""An upper bound on the memory one statement's values can take, from its plan.

DataFusion's memory pool sees operator state (sorts, joins, aggregates),
not the arrays expressions produce. The bounded built-ins
(:mod:`~lake_query.planning.functions`) keep one call's output within
``LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES`` per batch, but concatenation
multiplies such values: ``s || s`` over a CTE doubles it at every level
(measured: three levels of a 50 MB ``repeat`` reach 915 MB RSS, and a
linear chain of eight 50 MB operands 2.4 GB, because DataFusion's constant
folding keeps every intermediate).

So the logical plan is walked once, bottom-up and without recursion, and
every value gets a bound counted in *units* of one batch of
``LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES``:

- a bounded function's output is one fresh unit, and so is a variable-size
  aggregate (``string_agg``, ``array_agg``) or a query parameter;
- a stored column inherits its scan: one scan's batch is taken as one unit
  for all its columns together, so a value holding ``k`` copies of stored
  columns counts ``k`` units (concatenating many *different* columns is one);
- a literal counts its bytes times the rows of a batch;
- ``||`` and the combining functions (``concat``, ``concat_ws``,
  ``array_concat``, ...) add their operands' bounds; ``replace``,
  ``regexp_replace``, ``translate``, case mapping and casts multiply theirs
  by how much one input byte can grow; functions with fixed-size results
  (``length``, comparisons, arithmetic, ``count``) count nothing;
- a column reference inherits its input's bound; unions add what meets; a
  join copies a few-row side's computed values into every row of a batch;
  a constant is folded once and then broadcast to every row of its batch;
- without bound (refused): a recursive CTE whose recursive term copies a
  work-table value more than once, ``replace`` with a non-literal
  replacement, ``string_agg``/``array_agg`` of computed large values (rows
  are not bounded), and a subquery expression that calls a bounded or
  accumulating function (DataFusion's Python API does not expose an
  expression's subquery plan, so its text is checked instead).

A node's cost is what its batch holds at once: the sum of its columns'
bounds plus the largest transient (the operands an expression evaluates
before its result, and every intermediate of constant subexpressions,
which constant folding keeps). A statement whose costliest node exceeds the
per-query memory share (``LAKE_QUERY_MEMORY_LIMIT_BYTES`` / 4) is refused
with :class:`~lake_core.errors.QueryTooLarge` before it runs. Unknown
expressions and plan nodes are bounded conservatively (the sum of what they
read). Stored rows multiplied by many-to-many joins are outside this bound.
"""

from __future__ import annotations

import math
from typing import Any

from lake_core.config import QUERY_MAX_FUNCTION_OUTPUT_BYTES as MAX_FUNCTION_OUTPUT_BYTES
from lake_core.config import QUERY_MEMORY_LIMIT_BYTES as MEMORY_LIMIT_BYTES
from lake_core.errors import QueryTooLarge
from lake_query.planning.functions import BOUNDED_FUNCTIONS, ROWS_PER_BATCH, SIZED_FUNCTIONS
from lake_query.planning.sizes import (
    ACCUMULATING,
    CAST_GROWTH,
    FIXED,
    FIXED_AGGREGATES,
    GROWTH,
    PICKING,
    WRITTEN,
    casts_to_fixed,
    literal_bytes,
    literal_output,
    may_amplify,
    subquery_computes_large_values,
)

__all__ = ["STORED_UNITS", "Bound", "check_amplification", "plan_units", "units"]

#: Leaf -> copies. Keys: ("scan", scan, column), ("fresh", n) for a computed
#: value, ("agg", n) for an aggregate of stored values, ("const",).
Bound = dict[tuple[Any, ...], float]

_CONST = ("const",)
#: What one batch of a scan's stored columns counts, together: an eighth of a
#: unit (8 MiB by default, 1 KiB a row). Stored values are not produced by the
#: statement, so they are bounded by what was written; the bound here is on
#: how many times a statement copies them.
STORED_UNITS = 0.125
#: Expressions whose value is not known at planning (not constant-folded).
_VARYING = frozenset(
    {"Column", "Placeholder", "ScalarSubquery", "AggregateFunction", "WindowFunction"}
)
_NOTHING: Bound = {}


def _add(*bounds: Bound) -> Bound:
    out: Bound = {}
    for bound in bounds:
        for key, count in bound.items():
            out[key] = out.get(key, 0.0) + count
    return out


def _scale(bound: Bound, factor: float) -> Bound:
    return {key: count * factor for key, count in bound.items()}


def units(bound: Bound) -> float:
    """How many units of ``LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES`` ``bound`` may take."""
    total = 0.0
    scans: dict[Any, float] = {}
    for key, count in bound.items():
        if key[0] == "scan":
            scans[key[1]] = max(scans.get(key[1], 0.0), count)
        else:
            total += count
    return total + sum(scans.values())


class _Exceeded(Exception):
    """The walk passed its limit: the rest of the plan cannot lower the peak."""

    def __init__(self, units: float) -> None:
        self.units = units


class _Walk:
    """One statement's bounds, walked node by node."""

    def __init__(self, unit_bytes: int, limit: float) -> None:
        self.unit_bytes = unit_bytes
        self.limit = limit
        self.fresh = 0
        #: The costliest node so far, and the current node's transient cost.
        self.peak = 0.0
        self.transient = 0.0
        self.scans = 0

    def new_leaf(self, weight: float = 1.0, kind: str = "fresh") -> Bound:
        self.fresh += 1
        return {(kind, self.fresh): weight}

    def expression(self, root: Any, resolve: Any, rows: int = ROWS_PER_BATCH) -> Bound:
        """The bound of one batch of ``root`` over ``rows`` input rows a batch.

        Records the transient cost on this node. A constant subexpression is
        bound per value (DataFusion folds it once) and counted ``rows`` times
        where it meets a column or leaves the expression: it is broadcast.
        """
        # Iterative post-order: expressions may be hundreds of operators deep.
        # DataFusion hands out new Python objects per call: children are kept.
        order: list[tuple[Any, list[Any]]] = []
        stack: list[Any] = [root]
        while stack:
            node = stack.pop()
            children = _operands(node)
            order.append((node, children))
            stack.extend(children)
        results: dict[int, tuple[Bound, bool]] = {}
        transient = folded = 0.0
        for node, children in reversed(order):
            kind = node.variant_name()
            constant = kind not in _VARYING and all(results[id(c)][1] for c in children)
            child_bounds = [
                results[id(c)][0]
                if constant or not results[id(c)][1]
                else _scale(results[id(c)][0], rows)
                for c in children
            ]
            bound = self._node(node, kind, children, child_bounds, resolve)
            results[id(node)] = (bound, constant)
            value = units(bound)
            if value > self.limit:
                raise _Exceeded(value)  # a long chain stops here, not 500 operands on
            if kind in ("Column", "Literal", "Alias"):
                continue
            if constant:
                folded += units(bound)  # constant folding keeps every intermediate
            # Operands computed here are held with the result; columns exist already.
            computed = [b for c, b in zip(children, child_bounds, strict=True) if _computed(c)]
            transient = max(transient, units(bound) + units(_add(*computed)))
        self.transient = max(self.transient, transient) + folded
        bound, constant = results[id(root)]
        return _scale(bound, rows) if constant else bound

    def _node(
        self, node: Any, kind: str, children: list[Any], bounds: list[Bound], resolve: Any
    ) -> Bound:
        if kind == "Column":
            return resolve(node)
        if kind == "Literal":
            size = literal_bytes(node)
            return {_CONST: size / self.unit_bytes} if size else _NOTHING
        if kind in ("Alias", "Negative", "Not", "IsNull", "IsNotNull"):
            return bounds[0] if bounds and kind == "Alias" else _NOTHING
        if kind == "BinaryExpr":
            operator = _operator(node)
            return _add(*bounds) if operator == "||" else _NOTHING
        if kind in ("Cast", "TryCast"):
            if not bounds or casts_to_fixed(node):
                return _NOTHING
            return _scale(bounds[0], CAST_GROWTH)
        if kind == "ScalarFunction":
            return self._function(_operator(node).lower(), children, bounds)
        if kind in ("AggregateFunction", "WindowFunction"):
            # Their operator name is not exposed; the plan's own name for the call is.
            name = node.schema_name().split("(", 1)[0].strip().lower()
            if name in FIXED_AGGREGATES:
                return _NOTHING
            if name in PICKING:
                return _add(*bounds)
            argument = _add(*bounds)
            if name in ACCUMULATING:
                # Its value grows with every row of its group, and rows are not
                # bounded: only stored values (bounded by what was written) and
                # small constants may be accumulated, not computed large ones.
                if any(key[0] == "fresh" for key in argument) or math.isinf(units(argument)):
                    return {_CONST: math.inf}
                return _add(self.new_leaf(STORED_UNITS, "agg"), argument)
            return _add(self.new_leaf(), argument)
        if kind in ("Like", "ILike", "SimilarTo", "Between", "InList"):
            return _NOTHING
        if kind in ("Exists", "InSubquery"):
            return _NOTHING  # their plans are checked on the text (check_amplification)
        if kind in ("Placeholder", "ScalarSubquery"):
            return self.new_leaf()
        return _add(*bounds)  # Case and anything unknown: what it reads, together

    def _function(self, name: str, children: list[Any], bounds: list[Bound]) -> Bound:
        if name in BOUNDED_FUNCTIONS or name in SIZED_FUNCTIONS:
            size = literal_output(name, children)
            if size is None:
                return self.new_leaf()
            if not all(c.variant_name() == "Literal" for c in children):
                size *= ROWS_PER_BATCH  # a literal size over a column: one per row
            return {_CONST: min(size, self.unit_bytes) / self.unit_bytes}
        if name in FIXED:
            return _NOTHING
        if name in GROWTH:
            return _scale(_add(*bounds), GROWTH[name])
        written = WRITTEN.get(name)
        if written is not None and bounds:
            # Every input byte (and the empty match after it) may become the
            # literal text written in its place: a non-literal one is any length.
            sizes = [literal_bytes(children[i]) for i in written if i < len(children)]
            if any(size is None for size in sizes):
                return {_CONST: math.inf}
            growth = 1.0 + 2.0 * sum(size or 0 for size in sizes)
            return _add(_scale(bounds[0], growth), *bounds[1:])
        if name == "concat_ws" and bounds:
            return _add(_scale(bounds[0], max(1, len(bounds) - 2)), *bounds[1:])
        return _add(*bounds)


def _computed(expr: Any) -> bool:
    return expr.variant_name() not in ("Column", "Literal")


def _operator(expr: Any) -> str:
    try:
        return str(expr.rex_call_operator())
    except Exception:
        return ""


def _operands(expr: Any) -> list[Any]:
    kind = expr.variant_name()
    if kind in ("Column", "Literal", "Placeholder", "ScalarSubquery", "Exists", "InSubquery"):
        return []
    try:
        return list(expr.rex_call_operands())
    except Exception:
        return []


def _fields(variant: Any) -> list[str]:
    try:
        return list(variant.schema().field_names())
    except Exception:
        return []


def _resolver(names: list[str], bounds: list[Bound]) -> Any:
    index: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        index.setdefault(name, []).append(i)
        index.setdefault("\0" + name.rsplit(".", 1)[-1], []).append(i)
    everything = _add(*bounds)

    def resolve(column: Any) -> Bound:
        name = column.schema_name()
        hits = index.get(name) or index.get("\0" + name.rsplit(".", 1)[-1])
        if not hits:
            return everything  # not found: as much as all it could read
        return _add(*(bounds[i] for i in hits))

    return resolve


def plan_units(plan: Any, unit_bytes: int, limit: float = math.inf) -> float:
    """The largest number of units any node of ``plan`` holds at once.

    Raises ``_Exceeded`` as soon as one value is bound above ``limit``.
    """
    walk = _Walk(unit_bytes, limit)
    _walk_plan(walk, plan)
    return walk.peak


def _walk_plan(walk: _Walk, plan: Any) -> list[Bound]:
    """Bound every node of ``plan`` into ``walk``; the bounds of its output columns."""
    unit_bytes = walk.unit_bytes
    order: list[tuple[Any, list[Any]]] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        children = list(node.inputs())
        order.append((node, children))
        stack.extend(children)
    done: dict[int, tuple[list[str], list[Bound], int]] = {}
    for node, children in reversed(order):
        inputs = [done[id(child)][1] for child in children]
        # Rows in one batch of the inputs: a constant is broadcast to as many.
        rows = sum(done[id(child)][2] for child in children) or 1
        try:
            variant = node.to_variant()
        except Exception:
            variant = None  # a node the Python API cannot convert: bounded below
        kind = type(variant).__name__ if variant is not None else "Unknown"
        names = _fields(variant)
        flat = [b for columns in inputs for b in columns]
        walk.transient = 0.0
        if kind in ("Join", "CrossJoin"):
            # A join repeats a row of one side for many rows of the other.
            flat = [
                _duplicated(b, ROWS_PER_BATCH / max(1, done[id(child)][2]))
                for child, columns in zip(children, inputs, strict=True)
                for b in columns
            ]
        if kind == "TableScan":
            walk.scans += 1
            out: list[Bound] = [{("scan", walk.scans, name): STORED_UNITS} for name in names]
        elif kind == "RecursiveQuery":
            out = _recursive(inputs, names)
        else:
            input_names = [name for child in children for name in done[id(child)][0]]
            resolve = _resolver(input_names, flat)
            out = _outputs(walk, kind, variant, inputs, flat, names, resolve, rows)
        done[id(node)] = (names, out, _rows_out(kind, variant, rows, unit_bytes))
        walk.peak = max(walk.peak, units(_add(*out)) + walk.transient)
    return done[id(plan)][1]


def _outputs(
    walk: _Walk,
    kind: str,
    variant: Any,
    inputs: list[list[Bound]],
    flat: list[Bound],
    names: list[str],
    resolve: Any,
    rows: int,
) -> list[Bound]:
    if kind == "Projection":
        return [walk.expression(e, resolve, rows) for e in variant.projections()]
    if kind == "Aggregate":
        exprs = [*variant.group_by_exprs(), *variant.aggregate_exprs()]
        out = [walk.expression(e, resolve, rows) for e in exprs]
        return out + [_NOTHING] * (len(names) - len(out))  # grouping-set ids
    if kind == "WindowExpr":
        return flat + [walk.expression(e, resolve, rows) for e in variant.get_window_expr()]
    if kind == "Union":
        out = [dict(b) for b in inputs[0]] if inputs else []
        for columns in inputs[1:]:
            out = [_add(a, b) for a, b in zip(out, columns, strict=False)]
        return out
    if kind == "Filter":
        walk.expression(variant.predicate(), resolve, rows)
    elif kind == "Sort":
        for sort in variant.sort_exprs():
            walk.expression(sort.expr(), resolve, rows)
    elif kind == "Join":
        condition = variant.filter()
        if condition is not None:
            walk.expression(condition, resolve, rows)
    if len(flat) == len(names):
        return flat  # Filter, Sort, Limit, SubqueryAlias, Join, Distinct, ...
    everything = _add(*flat)
    return [everything] * max(1, len(names))  # unknown: every column may hold it all


_ROW_KEEPING = frozenset(
    {"Projection", "Filter", "SubqueryAlias", "Sort", "Limit", "Distinct", "WindowExpr", "Union"}
)


def _duplicated(bound: Bound, factor: float) -> Bound:
    """A join side's bound once its rows are repeated for the other side's."""
    out: Bound = {}
    for key, count in bound.items():
        if key[0] == "scan":
            out[key] = count  # stored rows joined: bounded by the data, not here
        elif key[0] == "fresh":
            # One row may hold a whole batch's worth of a computed value (the
            # bounded functions cap a batch, not a row): every row may copy it.
            out[key] = count * ROWS_PER_BATCH
        else:
            out[key] = count * factor  # constants and aggregates: per row of their side
    return out


def _rows_out(kind: str, variant: Any, rows: int, unit_bytes: int) -> int:
    """Rows one output batch of a node may hold (a batch is at most ROWS_PER_BATCH)."""
    if kind == "EmptyRelation":
        return 1
    if kind == "Aggregate" and not variant.group_by_exprs():
        return 1
    if kind == "Unnest":
        # Unnest emits a list's elements in one batch: as many as its bounded
        # input can hold (8-byte elements of one unit).
        return max(ROWS_PER_BATCH, unit_bytes // 8)
    return rows if kind in _ROW_KEEPING else ROWS_PER_BATCH


def _recursive(inputs: list[list[Bound]], names: list[str]) -> list[Bound]:
    # The inputs are the static and the recursive term; the recursive term read
    # the work table as a scan of its own. A value that holds two copies of
    # a work-table value doubles at every iteration: no bound.
    static = inputs[0] if inputs else []
    recursive = inputs[1] if len(inputs) > 1 else []
    for bound in recursive:
        scans: dict[Any, float] = {}
        for key, count in bound.items():
            if key[0] == "scan":
                scans[(key[1], key[2])] = count
        if any(count > STORED_UNITS for count in scans.values()) or math.isinf(units(bound)):
            return [{_CONST: math.inf}] * max(1, len(names))
    return [_add(a, b) for a, b in zip(static, recursive, strict=False)] or [
        _NOTHING for _ in names
    ]


def check_amplification(plan: Any, unit_bytes: int, share_bytes: int) -> None:
    """Refuse ``plan`` if its values may take more than ``share_bytes`` at once."""
    text = plan.display_indent()
    if not may_amplify(text):
        return
    if subquery_computes_large_values(text):
        # DataFusion's Python API does not expose an expression's subquery plan.
        raise QueryTooLarge(
            "a subquery that repeats values or accumulates them (repeat, lpad, range, "
            "string_agg, ...) cannot be bounded before it runs: move it into a CTE "
            f"or a join (its values count against {MEMORY_LIMIT_BYTES} / 4)"
        )
    limit = share_bytes / unit_bytes
    try:
        peak = plan_units(plan, unit_bytes, limit)
    except _Exceeded as exceeded:
        peak = exceeded.units
    if peak > limit:
        shown = "unbounded" if math.isinf(peak) else f"up to {int(peak * unit_bytes)}"
        raise QueryTooLarge(
            f"the statement's values may take {shown} bytes at once (concatenation or "
            f"repetition of large values), more than this query's memory share of "
            f"{share_bytes} bytes ({MEMORY_LIMIT_BYTES} / 4; each repeated value counts "
            f"{unit_bytes} bytes, {MAX_FUNCTION_OUTPUT_BYTES})"
        )
