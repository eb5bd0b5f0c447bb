"""Bounded replacements for built-ins whose output size an argument chooses.

``repeat('x', 1500000000)`` asks DataFusion for a 1.5 GB string and
``range(0, 1e9)`` for an 8 GB list; DataFusion's memory pool does not see
scalar function outputs, so one such call can take a replica down. Each
execution session registers these versions under the built-ins' names:
they compute the output size first and refuse a batch whose output would
exceed ``LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES``, recording the refusal on
the query's :class:`FunctionBudget` so that the error is classified by
that record (RESOURCE_EXHAUSTED), not by DataFusion's message text.

Replaced: ``repeat``, ``array_repeat`` and the two-argument scalar forms
of ``range`` and ``generate_series`` (the table functions stream and are
bounded by the execution timeout). A Python UDF has one fixed signature,
so ``lpad``/``rpad`` (two- and three-argument forms) and ``array_resize``
are bounded before planning instead (:data:`SIZED_FUNCTIONS`): their size
argument must be an integer literal small enough that a whole batch of
outputs stays within the bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from datafusion import SessionContext, udf

from lake_core.config import QUERY_MAX_FUNCTION_OUTPUT_BYTES as MAX_FUNCTION_OUTPUT_BYTES
from lake_core.errors import IntegerOverflow, QueryTooLarge

__all__ = [
    "BOUNDED_FUNCTIONS",
    "MAX_FUNCTION_OUTPUT_BYTES",
    "ROWS_PER_BATCH",
    "SIZED_FUNCTIONS",
    "FunctionBudget",
    "register_bounded_functions",
]


#: The built-ins replaced here. A session registers only those its SQL names
#: (registering a Python function costs ~45 us; most statements name none).
BOUNDED_FUNCTIONS = frozenset({"repeat", "array_repeat", "range", "generate_series"})

#: Built-ins whose second argument is an output length, with the bytes one
#: unit of it may take (a UTF-8 character; an array element's slot). Checked
#: on the SQL text (:meth:`~lake_query.planning.limits.QueryLimits.check_text`).
SIZED_FUNCTIONS: dict[str, int] = {"lpad": 4, "rpad": 4, "array_resize": 8}
#: Rows DataFusion puts in one batch (its ``batch_size``; Lake sessions keep it).
ROWS_PER_BATCH = 8192


class FunctionBudget:
    """One query's bound on function outputs, and whether it was exceeded.

    Also where Lake's checked arithmetic (:mod:`~lake_query.planning.overflow`)
    records an integer overflow, the first one only.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._exceeded: str | None = None
        self._overflow: tuple[str, str] | None = None
        self._lock = threading.Lock()

    def overflowed(self, operation: str, type_name: str) -> None:
        with self._lock:
            if self._overflow is None:
                self._overflow = (operation, type_name)

    def charge(self, function: str, size: int) -> None:
        if size > self.max_bytes:
            with self._lock:
                self._exceeded = function
            raise ValueError(f"{function} output too large")

    def error(self) -> QueryTooLarge | IntegerOverflow | None:
        """The error for a refused call or an overflow, if there was one."""
        with self._lock:
            function, overflow = self._exceeded, self._overflow
        if overflow is not None:
            operation, type_name = overflow
            return IntegerOverflow(
                f"integer overflow in {operation} ({type_name}): the result is outside the "
                "type's range; cast an operand to DOUBLE or DECIMAL for a wider result"
            )
        if function is None:
            return None
        return QueryTooLarge(
            f"{function}() would produce more than {self.max_bytes} bytes "
            f"({MAX_FUNCTION_OUTPUT_BYTES})"
        )


def _counts(n: pa.Array) -> list[int]:
    return [max(0, int(v)) if v is not None else 0 for v in n.to_pylist()]


def _repeat(budget: FunctionBudget) -> Callable[..., pa.Array]:
    def repeat(s: pa.Array, n: pa.Array) -> pa.Array:
        lengths = pc.fill_null(pc.binary_length(s), 0).to_pylist()
        counts = _counts(n)
        budget.charge("repeat", sum(a * b for a, b in zip(lengths, counts, strict=True)))
        return pc.binary_repeat(s, pa.array(counts, pa.int64()))

    return repeat


def _array_repeat(budget: FunctionBudget) -> Callable[..., pa.Array]:
    def array_repeat(element: pa.Array, n: pa.Array) -> pa.Array:
        counts = _counts(n)
        budget.charge("array_repeat", 8 * sum(counts))
        values = element.to_pylist()
        return pa.array(
            [[v] * c for v, c in zip(values, counts, strict=True)], pa.list_(element.type)
        )

    return array_repeat


def _range(budget: FunctionBudget, name: str, inclusive: bool) -> Callable[..., pa.Array]:
    def series(start: pa.Array, stop: pa.Array, step: pa.Array | None = None) -> pa.Array:
        starts, stops = start.to_pylist(), stop.to_pylist()
        steps = step.to_pylist() if step is not None else [1] * len(starts)
        sizes = []
        for a, b, c in zip(starts, stops, steps, strict=True):
            if a is None or b is None or c is None or c == 0:
                sizes.append(0)
            else:
                sizes.append(max(0, (b - a) // c + (1 if inclusive else 0)))
        budget.charge(name, 8 * sum(sizes))
        out: list[list[int] | None] = []
        for a, b, c in zip(starts, stops, steps, strict=True):
            if a is None or b is None or c is None:
                out.append(None)
            elif c == 0:
                raise ValueError(f"{name} step cannot be zero")
            else:
                end = b + (1 if c > 0 else -1) if inclusive else b
                out.append(list(range(a, end, c)))
        return pa.array(out, pa.list_(pa.int64()))

    return series


def register_bounded_functions(
    ctx: SessionContext, budget: FunctionBudget, names: frozenset[str] = BOUNDED_FUNCTIONS
) -> None:
    """Register the bounded versions of ``names`` in ``ctx``, shadowing the built-ins."""
    i64, text = pa.int64(), pa.utf8()
    functions: list[Any] = [
        udf(_repeat(budget), [text, i64], text, "immutable", name="repeat"),
        udf(_array_repeat(budget), [i64, i64], pa.list_(i64), "immutable", name="array_repeat"),
        udf(_range(budget, "range", False), [i64, i64], pa.list_(i64), "immutable", name="range"),
        udf(
            _range(budget, "generate_series", True),
            [i64, i64],
            pa.list_(i64),
            "immutable",
            name="generate_series",
        ),
    ]
    for function in functions:
        if function.name in names:
            ctx.register_udf(function)
