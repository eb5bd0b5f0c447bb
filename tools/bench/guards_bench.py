"""What Query's statement guards cost, and how much of the pushdown corpus stays fast.

One in-process :class:`~lake_query.planning.Planner` over one local Lance
table, its limits switched call by call: Lake's side runs with every guard
on (token scan, plan depth, function-size checks, per-query memory pool
reserved from the replica's budget); the reference is the same planning and execution path with
``QueryLimits(enforce=False)`` (no guard, unbounded DataFusion memory).
Both plan and run the statement afresh each call, interleaved; each pair
compares the two sides' p50 over a block of calls.

- ``guards_point_query``: plan + execute of a one-row lookup (the direct
  Lance path), median latency ratio. Goal: <= 1.03x.
- ``guards_group_by``: plan + execute of a GROUP BY over the table
  (DataFusion, so a pool is reserved). Goal: <= 1.03x.
- ``guards_concat_query``: plan + execute of an ordinary concatenation over
  1,000 rows, which the amplification bound walks
  (:mod:`lake_query.planning.amplification`); report only.
- ``guards_aa_point_query``: the point query guarded on both sides (report
  only): what this method resolves.
- ``guards_pushdown_direct_share``: the share of the pushdown differential
  corpus (``packages/lake-query/tests/test_pushdown_differential.py``) that
  still takes the direct path, against all of it (report only).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import ModuleType

import lance
import numpy as np
import pyarrow as pa

from lake_core.models import CatalogEntry, TableDescriptor, incarnation_metadata
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_core.schemas import schema_to_base64
from lake_query.planning import Planner, QueryLimits
from tools.bench.harness import Figure, at_most, figure, measure, warmup_for

TABLE = TableRef("bench", "guards")
POINT = "SELECT * FROM bench.guards WHERE id = 4321"
GROUP_BY = "SELECT c % 64 AS g, count(*) AS n, sum(a) AS s FROM bench.guards GROUP BY c % 64"
CONCAT = (
    "SELECT id, cast(id AS varchar) || '-' || cast(c AS varchar) AS k "
    "FROM bench.guards WHERE id < 1000"
)
#: Pairs per figure, and runs per side in each pair (a pair compares two p50s:
#: one call's jitter on a shared machine is several percent, far above the
#: guards' microseconds, so single calls could not resolve a 3% goal).
#: A point query's calls spread from 16 to 27 ms here (a multi-threaded scan on
#: two cores), so its blocks are longer than the GROUP BY's.
QUICK_GUARD_PAIRS = 5
GUARD_PAIRS = 31
POINT_PAIRS = 41
QUICK_GUARD_BLOCK = 3
GUARD_BLOCK = 15
POINT_BLOCK = 41
_TESTS = Path(__file__).resolve().parents[2] / "packages" / "lake-query" / "tests"


def _table(rows: int) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "a": np.random.default_rng(7).random(rows),
            "c": ids * 7919 % 1_000_003,
        }
    )


def _catalog(root: Path, data: pa.Table) -> dict[TableRef, CatalogEntry]:
    incarnation = uuid.uuid4().hex
    schema = data.schema.with_metadata(incarnation_metadata(incarnation))
    location = str(root / "guards.lance")
    dataset = lance.write_dataset(data.replace_schema_metadata(schema.metadata), location)
    descriptor = TableDescriptor(
        location=location, incarnation=incarnation, version=1, engine_version=dataset.version
    )
    entry = CatalogEntry(
        table=TABLE, descriptor=descriptor, schema_ipc=schema_to_base64(data.schema)
    )
    return {TABLE: entry}


def _run_once(planner: Planner, sql: str) -> float:
    began = time.perf_counter()
    planned = planner.plan(sql, DEV_PRINCIPAL)
    rows = sum(batch.num_rows for batch in planner.execute(planned.spec, DEV_PRINCIPAL))
    elapsed = (time.perf_counter() - began) * 1000
    if rows == 0:
        raise AssertionError(f"{sql!r} returned no rows")
    return elapsed


def _differential() -> ModuleType:
    """The pushdown differential test module, loaded as a package member."""
    package = "lake_query_tests"
    if package not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            package, _TESTS / "__init__.py", submodule_search_locations=[str(_TESTS)]
        )
        assert spec is not None
        sys.modules[package] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{package}.test_pushdown_differential")


def _direct_share(root: Path) -> Figure:
    module = _differential()
    entries = _catalog(root / "types", module._table())
    ref = TableRef("robots", "types")
    entries = {ref: entries[TABLE].model_copy(update={"table": ref})}
    planner = Planner(entries.get, lambda: list(entries))
    direct = planned = 0
    for where in module.predicates():
        try:
            spec = planner.plan(f"SELECT * FROM robots.types WHERE {where}", DEV_PRINCIPAL).spec
        except Exception:
            continue  # refused at planning: neither path runs it
        planned += 1
        direct += planner._direct.recall(spec) is not None
    return figure(
        "guards_pushdown_direct_share",
        [float(direct)],
        [float(planned)],
        unit="predicates",
        goal=None,
    )


def run(quick: bool) -> list[Figure]:
    rows = 200_000 if quick else 2_000_000
    pairs = QUICK_GUARD_PAIRS if quick else GUARD_PAIRS
    block = QUICK_GUARD_BLOCK if quick else GUARD_BLOCK
    point_pairs = QUICK_GUARD_PAIRS if quick else POINT_PAIRS
    point_block = QUICK_GUARD_BLOCK if quick else POINT_BLOCK
    warmup = max(1, warmup_for(quick))
    with tempfile.TemporaryDirectory(prefix="lake-guards-bench-") as tmp:
        root = Path(tmp)
        entries = _catalog(root, _table(rows))

        # One planner for both sides, its guards switched call by call: two planner
        # instances (each with its own cache of opened datasets) differ by a few
        # percent on their own, which is more than the guards cost.
        shared = Planner(entries.get, lambda: list(entries), limits=QueryLimits())
        limits = {"guarded": QueryLimits(), "unguarded": QueryLimits(enforce=False)}

        def run_as(side: str, sql: str) -> float:
            shared.limits = limits[side]
            return _run_once(shared, sql)

        figures = []
        for name, sql, n, k in (
            ("guards_point_query", POINT, point_pairs, point_block),
            ("guards_group_by", GROUP_BY, pairs, block),
        ):
            figures.append(
                measure(
                    name,
                    lambda sql=sql: run_as("guarded", sql),  # type: ignore[misc]
                    lambda sql=sql: run_as("unguarded", sql),  # type: ignore[misc]
                    unit="ms",
                    goal=at_most(1.03, "<= 1.03x without the guards"),
                    pairs=n,
                    warmup=warmup,
                    block=k,
                )
            )
        # Report only. The A/A figure (the point query guarded on both sides) is the
        # method's floor: what two identical sides differ by.
        for name, sql, reference, n, k in (
            ("guards_concat_query", CONCAT, "unguarded", pairs, block),
            ("guards_aa_point_query", POINT, "guarded", point_pairs, point_block),
        ):
            figures.append(
                measure(
                    name,
                    lambda sql=sql: run_as("guarded", sql),  # type: ignore[misc]
                    lambda sql=sql, side=reference: run_as(side, sql),  # type: ignore[misc]
                    unit="ms",
                    goal=None,
                    pairs=n,
                    warmup=warmup,
                    block=k,
                )
            )
        figures.append(_direct_share(root))
        return figures
