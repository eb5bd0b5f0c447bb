"""Direct scans: queries Lance's own scanner answers without DataFusion.

A plain projection of every column (``SELECT * FROM t``), optionally filtered
by a WHERE clause :mod:`lake_query.planning.pushdown` can render exactly,
needs nothing else from DataFusion, whose Lance provider yields 8192-row
batches that then have to be merged and adds its own per-query set-up.
Lance's scanner reads the same pinned version at the batch size Flight
wants, using scalar indexes for the filter, several times faster.

The decision is made from the plan as written (analyzed, not optimized:
the optimizer costs more than the whole direct-scan decision) by matching
DataFusion's plan node classes, before any batch is produced.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pyarrow as pa
from datafusion.expr import Column, Filter, Projection, TableScan

from lake_query.planning.batches import TARGET_BATCH_BYTES
from lake_query.planning.pushdown import to_lance_filter
from lake_query.planning.spec import QuerySpec

__all__ = [
    "DirectPlans",
    "DirectScan",
    "batch_rows_for",
    "direct_plan",
    "plain_projection",
    "scan_directly",
]

P = TypeVar("P")


@dataclass(frozen=True)
class DirectScan:
    """A query Lance's scanner answers alone: columns of one table, maybe a filter."""

    columns: list[str]
    row_filter: str | None  # Lance filter SQL
    batch_rows: int
    schema: pa.Schema
    #: Whether the scan cache may keep its batches (key lookups: no, an index answers
    #: them anew for less than the room they would take from repeated scans).
    cacheable: bool = field(default=True, compare=False)

    @functools.cached_property
    def schema_ipc(self) -> bytes:
        """``schema`` serialized (field metadata included), computed once per plan."""
        return bytes(self.schema.serialize().to_pybytes())


def direct_plan(df: Any, datasets: list[Any], schema: pa.Schema) -> DirectScan | None:
    """The direct scan for ``df`` when its plan is a scan of one table, else None."""
    if len(datasets) != 1:
        return None
    try:
        shape = _scan_shape(df)
    except Exception:  # a plan node the bindings cannot convert: not a plain scan
        return None
    if shape is None:
        return None
    columns, predicate = shape
    if columns != schema.names or len(set(columns)) != len(columns):
        return None
    row_filter = None
    if predicate is not None:
        row_filter = to_lance_filter([predicate], datasets[0].schema)
        if row_filter is None:
            return None
    return DirectScan(columns, row_filter, batch_rows_for(schema), schema)


def batch_rows_for(schema: pa.Schema) -> int:
    """Rows per scanned batch so one batch is about a Flight message."""
    row_bytes = sum(_estimated_width(field.type) for field in schema) or 1
    return max(1024, min(1 << 20, int(TARGET_BATCH_BYTES * 1.75) // row_bytes))


def plain_projection(df: Any, schema: pa.Schema) -> bool:
    """Whether ``df`` is exactly ``schema``'s columns of one table: no filter, no LIMIT."""
    try:
        shape = _scan_shape(df)
    except Exception:  # a plan node the bindings cannot convert: not a plain scan
        return False
    if shape is None or shape[1] is not None:
        return False
    columns = shape[0]
    return columns == schema.names and len(set(columns)) == len(columns)


def _scan_shape(df: Any) -> tuple[list[str], Any] | None:
    """The columns and WHERE predicate of ``Projection [Filter] TableScan``, as written."""
    projection = df.logical_plan().to_variant()
    if not isinstance(projection, Projection):
        return None
    columns = []
    for expr in projection.projections():
        column = expr.to_variant()
        if not isinstance(column, Column):
            return None  # an expression, alias or literal
        columns.append(column.name())
    below = projection.input()[0].to_variant()
    predicate = None
    if isinstance(below, Filter):
        predicate = below.predicate()
        below = below.input()[0].to_variant()
    if not isinstance(below, TableScan) or below.fetch() is not None or below.filters():
        return None
    if "information_schema" in below.fqn():
        return None  # a listing, not a scan of the one pinned table
    return columns, predicate


def scan_directly(
    dataset: Any,
    plan: DirectScan,
    on_error: Callable[[BaseException], Exception],
    *,
    fragments: list[Any] | None = None,
) -> Iterator[pa.RecordBatch] | None:
    """Run ``plan`` on ``dataset``; None if Lance refuses its filter (DataFusion can run it).

    ``fragments``: only these fragments of the pinned version (a partition).

    Lance resolves the filter when the scan starts, before any batch is
    produced, so a refusal here always falls back before the first byte.
    """
    try:
        scanner = dataset.scanner(
            columns=plan.columns,
            filter=plan.row_filter,
            batch_size=plan.batch_rows,
            fragments=fragments,
        )
        batches = scanner.to_batches()
    except (ValueError, OSError) as exc:
        if plan.row_filter is not None:
            return None
        raise on_error(exc) from None
    return (batch for batch in batches if batch.num_rows)


class DirectPlans(Generic[P]):
    """Direct scans found while planning, for the DoGet that follows on this replica.

    Keyed by the whole planned spec (SQL, parameters, pinned versions), from
    which the direct scan follows deterministically: a hit spares DoGet a
    DataFusion session and a second planning. A miss (another replica, or
    an evicted entry) plans again, as before. Authorization is never cached.
    ``P``: what DoGet needs of the plan (a :class:`DirectScan` of a Lance
    table; an external table's result schema).
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[QuerySpec, P] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, spec: QuerySpec, plan: P) -> None:
        with self._lock:
            self._plans[spec] = plan
            self._plans.move_to_end(spec)
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)

    def recall(self, spec: QuerySpec) -> P | None:
        with self._lock:
            return self._plans.get(spec)


def _estimated_width(data_type: pa.DataType) -> int:
    try:
        return max(1, int(data_type.bit_width) // 8)
    except ValueError:  # variable width: a guess; coalescing corrects it
        return 64
