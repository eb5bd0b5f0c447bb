"""What checked integer arithmetic costs (:mod:`lake_query.planning.overflow`).

Both sides run the same SQL in one in-process DataFusion session over one
local Lance table (BIGINT columns), interleaved call by call. Lake's side
rewrites the plan first (Substrait round trip, Arrow's checked kernels for
``+ - *``, integer ``sum`` in DECIMAL(38, 0) then narrowed); the reference
runs DataFusion's wrapping arithmetic on the same plan. Each pair compares
the two sides' p50 over a block of calls.

- ``overflow_arithmetic``: ``sum(a * 3 + b), max(a - b)`` over the table: the
  rewrite plus checked kernels on every row. Report only.
- ``overflow_group_by``: ``sum(a)`` grouped by 64 keys: the decimal sum. Report only.
- ``overflow_float_sum``: a ``sum`` over a DOUBLE column (nothing to check: the
  cost of finding that out). Goal: <= 1.05x (full size; report only when quick).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
from datafusion import SessionContext
from datafusion.catalog import Table

from lake_query.planning.functions import FunctionBudget
from lake_query.planning.overflow import checked_arithmetic
from tools.bench.harness import Figure, at_most, measure, warmup_for

ARITHMETIC = "SELECT sum(a * 3 + b) AS s, max(a - b) AS m FROM t"
GROUP_BY = "SELECT g, sum(a) AS s FROM t GROUP BY g"
FLOAT_SUM = "SELECT g, sum(f) AS s FROM t GROUP BY g"
QUICK_PAIRS, PAIRS = 5, 21
QUICK_BLOCK, BLOCK = 3, 9


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(36)
    return pa.table(
        {
            "a": rng.integers(-(10**9), 10**9, rows, dtype=np.int64),
            "b": rng.integers(-(10**9), 10**9, rows, dtype=np.int64),
            "g": np.arange(rows, dtype=np.int64) % 64,
            "f": rng.random(rows),
        }
    )


def _run(ctx: SessionContext, sql: str, checked: bool) -> float:
    began = time.perf_counter()
    df: Any = ctx.sql(sql)
    if checked:
        df = checked_arithmetic(ctx, df, FunctionBudget(1 << 30))
    rows = df.to_arrow_table().num_rows
    elapsed = (time.perf_counter() - began) * 1000
    if rows == 0:
        raise AssertionError(f"{sql!r} returned no rows")
    return elapsed


def run(quick: bool) -> list[Figure]:
    rows = 100_000 if quick else 2_000_000
    pairs = QUICK_PAIRS if quick else PAIRS
    block = QUICK_BLOCK if quick else BLOCK
    with tempfile.TemporaryDirectory(prefix="lake-overflow-bench-") as tmp:
        dataset = lance.write_dataset(_table(rows), str(Path(tmp) / "t.lance"))
        ctx = SessionContext()
        ctx.register_table("t", Table(lance.FFILanceTableProvider(dataset)))
        figures = []
        for name, sql, goal in (
            ("overflow_arithmetic", ARITHMETIC, None),
            ("overflow_group_by", GROUP_BY, None),
            # Quick runs are too short for a 5% goal (the fixed ~0.5 ms is 3% of them).
            ("overflow_float_sum", FLOAT_SUM, None if quick else at_most(1.05, "<= 1.05x")),
        ):
            figures.append(
                measure(
                    name,
                    lambda sql=sql: _run(ctx, sql, True),  # type: ignore[misc]
                    lambda sql=sql: _run(ctx, sql, False),  # type: ignore[misc]
                    unit="ms",
                    goal=goal,
                    pairs=pairs,
                    warmup=warmup_for(quick),
                    block=block,
                )
            )
        return figures
