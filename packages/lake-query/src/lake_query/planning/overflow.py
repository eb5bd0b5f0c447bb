"""Checked integer arithmetic: overflow is an error, never a wrapped value.

DataFusion 54 computes integer ``+``, ``-``, ``*`` and ``sum`` with
wrapping kernels (``9223372036854775807 + 1`` is a negative number), and no
setting changes that (its ``fail_on_overflow`` is not reachable from SQL
or Python). Lake rewrites the logical plan of a statement that may do
integer arithmetic before it runs:

- the plan goes to Substrait (JSON) and back, DataFusion's own round trip;
- each ``add``/``subtract``/``multiply``/``negate`` whose result is an
  integer type (found by asking DataFusion for the type of each candidate
  over the same input) becomes a Lake function computing it with Arrow's
  checked kernels (``add_checked``...);
- ``sum`` over an integer column sums in ``DECIMAL(38, 0)`` (which cannot
  overflow below 10**19 rows) and narrows the result back to DataFusion's
  sum type (``BIGINT``, or ``UBIGINT`` for unsigned), refusing a total out
  of that range.

The functions record what overflowed on the query's
:class:`~lake_query.planning.functions.FunctionBudget`, so the failure is
classified as :class:`~lake_core.errors.IntegerOverflow` from that record,
not from DataFusion's message text. Constant expressions are folded by the
optimizer after the rewrite, so ``SELECT 9223372036854775807 + 1`` fails too.
``/`` and ``%`` (``MIN / -1``) and ``abs`` are already checked by DataFusion.

Window ``sum`` over an integer is summed wide and narrowed the same way.
Correlated subqueries are rewritten on a plan decorrelated without constant
folding (:func:`_sources`). A statement with no ``+``, ``-``, ``*`` or ``sum``
in its text is never rewritten, and direct scans never run DataFusion at all.

Not rewritten (documented in docs/sql.md, logged as ``integer overflow not
checked``): statements with ``unnest`` or a recursive CTE. DataFusion 54's
Substrait producer has no form for ``Unnest`` or ``RecursiveQuery`` (nor
for the lateral subquery of ``FROM t, unnest(t.l)``), logical or optimized.
The other ways to rebuild a plan from Python were tried and do not reach
these statements either:

- datafusion-proto (``LogicalPlan.to_bytes``/``from_bytes``) encodes both
  nodes, but not a scan of a Lake table: Lance's ``FFILanceTableProvider``
  is a custom table, which needs a ``LogicalExtensionCodec``; datafusion-python
  accepts only FFI codecs (``with_logical_extension_codec``), Lance exports
  none and the default codec inlines only Python UDFs. It also refuses
  ``outer_ref`` (lateral ``unnest``) and ``IN``/``EXISTS``/scalar subqueries.
  Only table-less statements (``unnest([2, 3])``) round-trip.
- ``datafusion.execution.enable_ansi_mode`` applies to Spark functions only:
  ``9223372036854775807 + 1`` and ``sum`` still wrap with it on, even with
  ``enable_spark_functions()``. No other of the 150 settings is about overflow.
- The physical plan's protobuf form fails the same way (Lance's scan is a
  foreign execution plan needing a ``PhysicalExtensionCodec``), and a
  physical optimizer rule can only be an FFI one.
- The plan classes (``datafusion.expr.Unnest``, ``RecursiveQuery``...) are
  read-only, and the unparser (plan to SQL) refuses ``RecursiveQuery``, so a
  plan cannot be split and rebuilt around those nodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from datafusion import SessionConfig, SessionContext, udf
from datafusion import substrait as ss

from lake_query.planning.functions import FunctionBudget

__all__ = ["OPERATIONS", "checked_arithmetic", "may_overflow"]

log = structlog.get_logger("lake_query.planning.overflow")

#: Substrait function name -> (the operation's name in messages, Arrow's checked kernel).
OPERATIONS: dict[str, tuple[str, Callable[..., pa.Array]]] = {
    "add": ("addition", pc.add_checked),
    "subtract": ("subtraction", pc.subtract_checked),
    "multiply": ("multiplication", pc.multiply_checked),
    "negate": ("negation", pc.negate_checked),
}
_SUM = "sum"
_WIDE = pa.decimal128(38, 0)

_INTEGERS = {
    str(t): t
    for t in (
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
    )
}

_QUOTED = re.compile(r"'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?")
# `*` as a wildcard or in count(*) is no arithmetic; every other + - * or a sum may be.
_WILDCARD = re.compile(r"(\(|,|\.|\bselect|\bdistinct)\s*\*", re.IGNORECASE)
_OPERATOR = re.compile(r"[+\-*]|\bsum\b", re.IGNORECASE)


def may_overflow(sql: str) -> bool:
    """Whether ``sql``'s text has an operator or ``sum`` that may do integer arithmetic."""
    text = _WILDCARD.sub(" ", _QUOTED.sub("''", sql))
    return _OPERATOR.search(text) is not None


def _function(
    budget: FunctionBudget, operation: str, type_name: str, kernel: Callable[..., pa.Array]
) -> Callable[..., pa.Array]:
    def checked(*args: pa.Array) -> pa.Array:
        try:
            return kernel(*args)
        except pa.ArrowInvalid:
            budget.overflowed(operation, type_name)
            raise ValueError(f"integer overflow in {operation} ({type_name})") from None

    return checked


def _narrow(target: pa.DataType) -> Callable[[pa.Array], pa.Array]:
    def narrow(total: pa.Array) -> pa.Array:
        return pc.cast(total, target, safe=True)

    return narrow


class _Rewrite:
    """One statement's rewrite: the Substrait plan, its new functions, the session."""

    def __init__(self, ctx: SessionContext, plan: dict[str, Any], budget: FunctionBudget) -> None:
        self.ctx = ctx
        self.plan = plan
        self.budget = budget
        self.anchors = {
            ext["extensionFunction"].get("functionAnchor", 0): ext["extensionFunction"]["name"]
            for ext in plan.get("extensions", ())
            if "extensionFunction" in ext
        }
        self._registered: dict[str, int] = {}
        self.changed = False

    # -- types -------------------------------------------------------------
    def _probe(
        self, rel: dict[str, Any], expressions: list[dict[str, Any]]
    ) -> list[pa.DataType | None]:
        """DataFusion's types for ``expressions`` evaluated over ``rel``'s output
        (None: not an integer, known without asking DataFusion)."""
        known = _read_types(rel, expressions)
        if known is not None:
            return known
        probe = {k: v for k, v in self.plan.items() if k != "relations"}
        probe["relations"] = [
            {"root": {"input": {"project": {"input": rel, "expressions": expressions}}}}
        ]
        consumed = ss.Consumer.from_substrait_plan(self.ctx, ss.Plan.from_json(json.dumps(probe)))
        schema = self.ctx.create_dataframe_from_logical_plan(consumed).schema()
        return [schema.field(i).type for i in range(len(schema) - len(expressions), len(schema))]

    def _output_width(self, rel: dict[str, Any]) -> int:
        probe = {k: v for k, v in self.plan.items() if k != "relations"}
        probe["relations"] = [{"root": {"input": rel}}]
        consumed = ss.Consumer.from_substrait_plan(self.ctx, ss.Plan.from_json(json.dumps(probe)))
        return len(self.ctx.create_dataframe_from_logical_plan(consumed).schema())

    # -- functions ---------------------------------------------------------
    def _anchor(self, name: str, make: Callable[[], Any]) -> int:
        known = self._registered.get(name)
        if known is not None:
            return known
        self.ctx.register_udf(make())
        anchor = max(self.anchors, default=-1) + 1
        self.anchors[anchor] = name
        self.plan.setdefault("extensions", []).append(
            {
                "extensionFunction": {
                    "extensionUrnReference": 4294967295,
                    "functionAnchor": anchor,
                    "name": name,
                }
            }
        )
        self._registered[name] = anchor
        return anchor

    def _checked(self, function: str, data_type: pa.DataType) -> int:
        operation, kernel = OPERATIONS[function]
        type_name = str(data_type)
        name = f"lake_checked_{function}_{type_name}"
        arity = 1 if function == "negate" else 2

        def make() -> Any:
            return udf(
                _function(self.budget, operation, type_name, kernel),
                [data_type] * arity,
                data_type,
                "volatile",
                name=name,
            )

        return self._anchor(name, make)

    def _narrowing(self, target: pa.DataType) -> int:
        name = f"lake_checked_sum_{target}"
        budget = self.budget
        narrow = _narrow(target)

        def checked(total: pa.Array) -> pa.Array:
            try:
                return narrow(total)
            except pa.ArrowInvalid:
                budget.overflowed("sum", str(target))
                raise ValueError(f"integer overflow in sum ({target})") from None

        return self._anchor(name, lambda: udf(checked, [_WIDE], target, "volatile", name=name))

    # -- expressions -------------------------------------------------------
    def _candidates(self, expression: Any) -> Iterator[dict[str, Any]]:
        """Arithmetic calls in ``expression`` (not inside its subqueries)."""
        stack = [expression]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, dict):
                call = node.get("scalarFunction")
                if (
                    isinstance(call, dict)
                    and self.anchors.get(call.get("functionReference", 0)) in OPERATIONS
                ):
                    yield node
                stack.extend(v for k, v in node.items() if k != "subquery")

    def _check_expressions(self, rel: dict[str, Any], expressions: list[Any]) -> None:
        calls = [c for e in expressions for c in self._candidates(e)]
        if not calls:
            return
        types = self._probe(rel, calls)
        for call, data_type in zip(calls, types, strict=True):
            if data_type is None or str(data_type) not in _INTEGERS:
                continue
            function = self.anchors[call["scalarFunction"].get("functionReference", 0)]
            if function == "negate" and pa.types.is_unsigned_integer(data_type):
                continue
            call["scalarFunction"]["functionReference"] = self._checked(function, data_type)
            self.changed = True

    def _check_window_sums(self, holder: dict[str, Any]) -> None:
        """``sum(x) OVER (...)`` of an integer ``x``, a top-level expression of a
        project (DataFusion's Window node): summed wide, narrowed in a project above."""
        project = holder["project"]
        expressions = project.get("expressions", [])
        windows = [
            (i, e["windowFunction"])
            for i, e in enumerate(expressions)
            if isinstance(e.get("windowFunction"), dict)
            and self.anchors.get(e["windowFunction"].get("functionReference", 0)) == _SUM
            and len(e["windowFunction"].get("arguments", ())) == 1
        ]
        if not windows:
            return
        types = self._probe(project["input"], [w["arguments"][0]["value"] for _, w in windows])
        wide = [
            (i, w, t)
            for (i, w), t in zip(windows, types, strict=True)
            if t is not None and str(t) in _INTEGERS
        ]
        if not wide:
            return
        width = self._output_width(project["input"])
        mapping = project.get("common", {}).get("emit", {}).get("outputMapping")
        outputs = list(mapping) if mapping is not None else list(range(width + len(expressions)))
        narrowed: dict[int, dict[str, Any]] = {}
        for index, window, data_type in wide:
            if width + index not in outputs:
                continue
            target = pa.uint64() if pa.types.is_unsigned_integer(data_type) else pa.int64()
            argument = window["arguments"][0]
            argument["value"] = _widened(argument["value"])
            position = outputs.index(width + index)
            narrowed[position] = {
                "scalarFunction": {
                    "functionReference": self._narrowing(target),
                    "arguments": [{"value": _field(position)}],
                }
            }
        if not narrowed:
            return
        order = sorted(narrowed)
        count = len(outputs)
        holder["project"] = {
            "common": {
                "emit": {
                    "outputMapping": [
                        count + order.index(i) if i in narrowed else i for i in range(count)
                    ]
                }
            },
            "input": {"project": project},
            "expressions": [narrowed[i] for i in order],
        }
        self.changed = True

    def _check_sums(self, holder: dict[str, Any]) -> None:
        aggregate = holder["aggregate"]
        measures = aggregate.get("measures", [])
        sums = [
            (i, m["measure"])
            for i, m in enumerate(measures)
            if self.anchors.get(m["measure"].get("functionReference", 0)) == _SUM
            and len(m["measure"].get("arguments", ())) == 1
        ]
        if not sums or "common" in aggregate:
            return
        types = self._probe(aggregate["input"], [m["arguments"][0]["value"] for _, m in sums])
        if not any(t is not None and str(t) in _INTEGERS for t in types):
            return
        width = self._output_width({"aggregate": aggregate})
        narrowed: dict[int, dict[str, Any]] = {}
        for (index, measure), data_type in zip(sums, types, strict=True):
            if data_type is None or str(data_type) not in _INTEGERS:
                continue
            target = pa.uint64() if pa.types.is_unsigned_integer(data_type) else pa.int64()
            argument = measure["arguments"][0]
            argument["value"] = _widened(argument["value"])
            position = width - len(measures) + index
            narrowed[position] = {
                "scalarFunction": {
                    "functionReference": self._narrowing(target),
                    "arguments": [{"value": _field(position)}],
                }
            }
        if not narrowed:
            return
        order = sorted(narrowed)
        mapping = [width + order.index(i) if i in narrowed else i for i in range(width)]
        holder["project"] = {
            "common": {"emit": {"outputMapping": mapping}},
            "input": {"aggregate": holder.pop("aggregate")},
            "expressions": [narrowed[i] for i in order],
        }
        self.changed = True

    # -- relations ---------------------------------------------------------
    def rel(self, holder: dict[str, Any]) -> None:
        """Rewrite the relation ``holder`` holds, inputs first."""
        for kind, body in list(holder.items()):
            if not isinstance(body, dict):
                continue
            for key in ("input", "left", "right"):
                if isinstance(body.get(key), dict):
                    self.rel(body[key])
            for child in body.get("inputs", ()):
                self.rel(child)
            for sub in _subqueries(body):
                self.rel(sub)
            if kind == "project":
                self._check_expressions(body["input"], body.get("expressions", []))
                self._check_window_sums(holder)
            elif kind == "filter":
                self._check_expressions(body["input"], [body.get("condition")])
            elif kind == "sort":
                self._check_expressions(body["input"], [s.get("expr") for s in body["sorts"]])
            elif kind == "join":
                both = {"cross": {"left": body["left"], "right": body["right"]}}
                self._check_expressions(both, [body.get("expression"), body.get("postJoinFilter")])
            elif kind == "aggregate":
                expressions = list(body.get("groupingExpressions", []))
                for grouping in body.get("groupings", []):
                    expressions.extend(grouping.get("groupingExpressions", []))
                for measure in body.get("measures", []):
                    expressions.extend(measure["measure"].get("arguments", []))
                    expressions.append(measure.get("filter"))
                self._check_expressions(body["input"], expressions)
                self._check_sums(holder)


#: Substrait types of stored columns that are certainly not integers.
_NOT_INTEGER = frozenset(
    {
        "fp32",
        "fp64",
        "decimal",
        "string",
        "varchar",
        "binary",
        "bool",
        "boolean",
        "date",
        "timestamp",
        "timestampTz",
        "precisionTimestamp",
        "precisionTimestampTz",
        "struct",
        "list",
    }
)


def _read_types(
    rel: dict[str, Any], expressions: list[dict[str, Any]]
) -> list[pa.DataType | None] | None:
    """None for each expression when all are stored non-integer columns of a scan
    (a float ``sum`` needs no probe), else None: DataFusion must be asked."""
    read = rel.get("read")
    if not isinstance(read, dict) or "common" in read or "projection" in read:
        return None
    columns = read.get("baseSchema", {}).get("struct", {}).get("types", [])
    for expression in expressions:
        try:
            index = expression["selection"]["directReference"]["structField"].get("field", 0)
            if set(expression["selection"]) != {"directReference", "rootReference"}:
                return None
            (kind,) = columns[index].keys()
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        if kind not in _NOT_INTEGER:
            return None
    return [None] * len(expressions)


def _widened(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` cast to DECIMAL(38, 0), where a sum of BIGINTs cannot overflow."""
    decimal = {"scale": 0, "precision": 38, "nullability": "NULLABILITY_NULLABLE"}
    return {
        "cast": {
            "type": {"decimal": decimal},
            "input": value,
            "failureBehavior": "FAILURE_BEHAVIOR_THROW_EXCEPTION",
        }
    }


def _kind(exc: BaseException) -> str:
    """What failed, without the engine's plan text (it names tables and columns)."""
    words = re.findall(r"[A-Za-z]+", str(exc))[:6]
    return " ".join(words) or type(exc).__name__


def _same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """Same names, types and field metadata (a Lake function's result is always nullable;
    batches are conformed to the planned schema on the way out)."""
    return a.names == b.names and all(
        x.type == y.type and x.metadata == y.metadata for x, y in zip(a, b, strict=True)
    )


def _field(index: int) -> dict[str, Any]:
    return {
        "selection": {
            "directReference": {"structField": {"field": index}},
            "rootReference": {},
        }
    }


def _subqueries(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The relations of subqueries inside ``body``'s expressions."""
    stack: list[Any] = [v for k, v in body.items() if k not in ("input", "left", "right", "inputs")]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("input", "haystack") and isinstance(value, dict) and _is_rel(value):
                    yield value
                else:
                    stack.append(value)


_REL_KINDS = frozenset(
    {"read", "project", "filter", "aggregate", "sort", "fetch", "join", "cross", "set"}
)


def _is_rel(node: dict[str, Any]) -> bool:
    return bool(node.keys() & _REL_KINDS) and len(node) <= 2


#: DataFusion's optimizer rules that fold constant expressions (wrapping on
#: overflow) and move filters into scans (where the rewrite cannot reach them).
_UNFOLDED_WITHOUT = ("simplify_expressions", "push_down_filter")


def _sources(df: Any) -> Iterator[Callable[[], Any]]:
    """The plans to rewrite, in order of preference.

    The logical plan first: every expression as written. A correlated
    subquery has no Substrait form until the optimizer decorrelates it, and
    the optimizer also folds constants, with wrapping arithmetic, and pushes
    filters into scans. So next the plan decorrelated by an optimizer without
    those two rules (in a scratch session: the statement itself still runs
    with all of them, folding the checked functions, so a constant overflow
    fails as it is planned), and last the optimized plan as it is.
    """
    yield df.logical_plan

    def unfolded() -> Any:
        # Written join order, as Lake's sessions keep it when metadata differs (catalog.py).
        scratch = SessionContext(
            SessionConfig().set("datafusion.optimizer.join_reordering", "false")
        )
        for rule in _UNFOLDED_WITHOUT:
            scratch.remove_optimizer_rule(rule)
        return scratch.create_dataframe_from_logical_plan(
            df.logical_plan()
        ).optimized_logical_plan()

    yield unfolded
    yield df.optimized_logical_plan


def checked_arithmetic(ctx: SessionContext, df: Any, budget: FunctionBudget) -> Any:
    """``df`` with its integer arithmetic checked, or ``df`` itself when it has none.

    ``ctx`` must be the session ``df`` was planned in; the Lake functions are
    registered there. A plan DataFusion cannot express in Substrait runs
    unchanged (logged; see the module docstring).
    """
    plan = None
    for source in _sources(df):
        try:
            plan = json.loads(ss.Producer.to_substrait_plan(source(), ctx).to_json())
            break
        except Exception as exc:  # no Substrait form for some node
            # The engine's text names tables and columns: only its first words are logged.
            error = _kind(exc)
    if plan is None:
        log.info("integer overflow not checked: no Substrait form", reason=error)
        return df
    rewrite = _Rewrite(ctx, plan, budget)
    names = set(rewrite.anchors.values())
    if not names & (OPERATIONS.keys() | {_SUM}):
        return df
    try:
        for relation in plan.get("relations", []):
            root = relation.get("root", relation)
            if isinstance(root.get("input"), dict):
                rewrite.rel(root["input"])
        if not rewrite.changed:
            return df
        consumed = ss.Consumer.from_substrait_plan(ctx, ss.Plan.from_json(json.dumps(plan)))
        checked = ctx.create_dataframe_from_logical_plan(consumed)
        if not _same_columns(checked.schema(), df.schema()):
            log.warning("integer overflow not checked: the rewritten plan changed the schema")
            return df
    except Exception as exc:
        if budget.error() is not None:
            raise  # a constant overflowed while the rewrite planned it
        log.warning("integer overflow not checked: rewrite failed", reason=_kind(exc))
        return df
    return checked
