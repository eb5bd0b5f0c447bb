"""Partitioned scans: one result split into fragment ranges of its pinned version.

A plain scan of one table (what :mod:`lake_query.planning.direct` recognises:
bare columns of one ``TableScan``, at most a filter Lance evaluates exactly)
is row-local: each output row is one stored row, kept or dropped on its own
values. So the pinned version's fragments can be cut into contiguous ranges,
each scanned alone on any replica: the ranges' rows are disjoint and their
union is the whole result. Every other plan keeps one endpoint: a sort, an
aggregate or DISTINCT, a LIMIT, a window, a join, a computed expression
(anything whose rows depend on other rows, or that DataFusion has to
compute) is not a direct scan. The decision reads the plan's node classes,
never the SQL text.

Joins could be partitioned on one side in some shapes (an inner join of a
big table with a small one), but proving the shape safe takes more than the
node classes give, so they stay whole.

Partitioning only changes how the rows are delivered; every partition runs
under the same ticket, admission, stall and deadline checks as a whole scan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lake_core.config import QUERY_MAX_ENDPOINTS, QUERY_MIN_ENDPOINT_ROWS, env_int
from lake_core.errors import InvalidArgument
from lake_query.planning.direct import DirectScan, scan_directly

__all__ = [
    "DEFAULT_MAX_ENDPOINTS",
    "DEFAULT_MIN_ENDPOINT_ROWS",
    "MAX_ENDPOINTS",
    "PartitionLimits",
    "fragment_ranges",
    "incompatible_partition",
    "partition_ids",
    "scan_partition",
]

DEFAULT_MAX_ENDPOINTS = 8
MAX_ENDPOINTS = 256
DEFAULT_MIN_ENDPOINT_ROWS = 262_144
_MAX_MIN_ENDPOINT_ROWS = 1 << 40

#: A ticket for a different Lake version's plan (the seal proves it is genuine).
_INCOMPATIBLE = "partition ticket from an incompatible Lake Query version"


@dataclass(frozen=True)
class PartitionLimits:
    """How many endpoints a partitionable scan gets (every replica must agree)."""

    max_endpoints: int = DEFAULT_MAX_ENDPOINTS
    min_endpoint_rows: int = DEFAULT_MIN_ENDPOINT_ROWS

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PartitionLimits:
        return cls(
            max_endpoints=env_int(
                QUERY_MAX_ENDPOINTS, DEFAULT_MAX_ENDPOINTS, 1, MAX_ENDPOINTS, env
            ),
            min_endpoint_rows=env_int(
                QUERY_MIN_ENDPOINT_ROWS, DEFAULT_MIN_ENDPOINT_ROWS, 1, _MAX_MIN_ENDPOINT_ROWS, env
            ),
        )


def fragment_ranges(
    dataset: Any, plan: DirectScan, limits: PartitionLimits
) -> tuple[tuple[int, ...], ...]:
    """The fragment ids each endpoint scans, in fragment order; () keeps one endpoint.

    One endpoint too for a filter Lance cannot plan (DataFusion answers it,
    over the whole table) and for a filtered scan of an indexed table.

    Deterministic for a pinned version and the limits: the ranges come from
    the version's manifest alone, balanced by stored rows.
    """
    if limits.max_endpoints < 2:
        return ()
    fragments = sorted(
        (int(f.fragment_id), int(f.metadata.physical_rows or 0)) for f in dataset.get_fragments()
    )
    total = sum(rows for _, rows in fragments)
    count = min(limits.max_endpoints, len(fragments), total // limits.min_endpoint_rows)
    if count < 2:
        return ()
    if plan.row_filter is not None and (_indexed(dataset) or not _lance_accepts(dataset, plan)):
        return ()
    ranges: list[tuple[int, ...]] = []
    current: list[int] = []
    seen = 0
    for position, (fragment_id, rows) in enumerate(fragments):
        current.append(fragment_id)
        seen += rows
        cuts_left = count - 1 - len(ranges)
        fragments_left = len(fragments) - position - 1
        if cuts_left and (seen * count >= total * (len(ranges) + 1) or fragments_left == cuts_left):
            ranges.append(tuple(current))
            current = []
    ranges.append(tuple(current))
    return tuple(ranges)


def _indexed(dataset: Any) -> bool:
    """Whether the version has a scalar index a filter may be answered from.

    An indexed lookup reads a few rows wherever they are; splitting it would
    repeat the lookup once per endpoint and make the client open several
    streams for a handful of rows, so filtered scans of indexed tables keep
    one endpoint (selectivity is not known at planning).
    """
    return bool(dataset.describe_indices())


def _lance_accepts(dataset: Any, plan: DirectScan) -> bool:
    """Whether Lance can plan ``plan``'s filter (it plans without reading data)."""
    try:
        dataset.scanner(columns=plan.columns, filter=plan.row_filter).explain_plan()
    except (ValueError, OSError):
        return False
    return True


def incompatible_partition() -> InvalidArgument:
    """The refusal of a partition ticket this replica cannot run (another Lake version's)."""
    return InvalidArgument(_INCOMPATIBLE)


def partition_ids(raw: object) -> list[int]:
    """The fragment ids a partition ticket carries (sealed, so only a version skew fails)."""
    if (
        not isinstance(raw, list)
        or not raw
        or len(raw) > 1 << 20
        or not all(type(i) is int and i >= 0 for i in raw)
    ):
        raise InvalidArgument(_INCOMPATIBLE)
    return raw


def scan_partition(
    dataset: Any,
    plan: DirectScan | None,
    fragment_ids: Sequence[int],
    on_error: Callable[[BaseException], Exception],
) -> Iterator[pa.RecordBatch]:
    """Run ``plan`` over only ``fragment_ids`` of the pinned ``dataset``."""
    if plan is None:
        raise InvalidArgument(_INCOMPATIBLE)
    fragments = [dataset.get_fragment(i) for i in fragment_ids]
    if any(fragment is None for fragment in fragments):
        raise InvalidArgument(_INCOMPATIBLE)
    batches = scan_directly(dataset, plan, on_error, fragments=fragments)
    if batches is None:
        # Planning checked that Lance plans this filter; a replica that
        # cannot is another Lake version.
        raise InvalidArgument(_INCOMPATIBLE)
    return batches
