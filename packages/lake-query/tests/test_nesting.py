"""The nesting guard: every nesting form counted, and what it lets through plans quickly.

The fuzz runs DataFusion itself (what Query plans with) on a thread with a
deadline: a statement the guard admits must plan (or fail to) within it,
and one it refuses is refused before any parser sees it. Its run time is
bounded by the corpus size and the per-statement deadline.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time

import pytest
from datafusion import SessionContext

from lake_core.errors import InvalidArgument
from lake_core.principal import DEV_PRINCIPAL
from lake_query.planning import Planner, QueryLimits
from lake_query.planning.nesting import nesting_depth
from tools.lake_testing.nesting import FORMS, HANGS, nest, nested_statement

from .conftest import LocalCatalog

SEED = 36_2026
#: Random statements planned by DataFusion in the fuzz (each well under a millisecond
#: to a few ms when admitted; refused ones are not planned).
FUZZ = 400
#: Longest an admitted statement may take to plan here (a loaded 2-core machine).
PLAN_BOUND_S = 5.0


def _plan_seconds(sql: str, bound_s: float) -> float | None:
    """Seconds DataFusion took to plan ``sql`` (errors count as planned); None past ``bound_s``."""
    took: list[float] = []

    def run() -> None:
        ctx = SessionContext()
        started = time.perf_counter()
        with contextlib.suppress(Exception):  # a parse or planning error ends planning too
            ctx.sql(sql).logical_plan()
        took.append(time.perf_counter() - started)

    # A daemon thread: if DataFusion never returns, the test fails instead of hanging.
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    return took[0] if took else None


@pytest.mark.parametrize(
    ("sql", "depth"),
    [
        ("SELECT 1", 1),
        ("SELECT (1)", 2),
        ("SELECT CAST(CAST(1 AS INT) AS BIGINT)", 3),
        ("SELECT NOT (true)", 3),
        ("SELECT NOT NOT true", 3),
        ("SELECT - - 1", 3),
        ("SELECT -(-(1))", 5),
        ("SELECT (SELECT 1)", 3),
        ("SELECT CASE WHEN a THEN CASE WHEN b THEN 1 END END", 3),
        # END closes its CASE: what follows is back at the outer level.
        ("SELECT CASE WHEN a THEN 1 END, CASE WHEN b THEN 2 END, CASE WHEN c THEN 3 END", 2),
        ("SELECT (((1))), (((2))), f(g(x)), [[1]]", 4),
        ("SELECT a AND b AND c AND d OR e", 2),
        ("SELECT a = -(b)", 4),
        ("SELECT x FROM t WHERE x IN (1, 2, 3)", 3),
        ("SELECT x FROM t WHERE x BETWEEN 1 AND (2)", 3),
        ("SELECT f(g(h(1)))", 4),
        ("SELECT [[1]]", 3),
        ("SELECT '((((((' || \"(((\" -- (((((\n", 2),
    ],
)
def test_the_depth_counts_every_form(sql: str, depth: int) -> None:
    assert nesting_depth(sql) == depth


def test_the_statements_that_never_finished_planning_are_refused(catalog: LocalCatalog) -> None:
    planner = Planner(catalog.resolve, catalog.refs)
    for sql in HANGS.values():
        started = time.monotonic()
        with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_NESTING_DEPTH"):
            planner.plan(sql, DEV_PRINCIPAL)
        assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_past_the_guard_is_refused_and_under_it_plans(form: str) -> None:
    limits = QueryLimits()
    depth = 1
    while nesting_depth("SELECT " + nest([form] * (depth + 1))) <= limits.max_nesting_depth:
        depth += 1
    deepest = "SELECT " + nest([form] * depth)
    limits.check_text(deepest, 0)
    took = _plan_seconds(deepest, PLAN_BOUND_S)
    assert took is not None, f"{form} x{depth} admitted but did not plan within {PLAN_BOUND_S}s"
    with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_NESTING_DEPTH"):
        limits.check_text("SELECT " + nest([form] * (depth + 1)), 0)
    # Far past the guard, and past the parser's own limit: still refused by the guard.
    with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_NESTING_DEPTH"):
        limits.check_text("SELECT " + nest([form] * 60), 0)


def test_a_fuzzed_nesting_corpus_is_refused_or_plans_quickly() -> None:
    rng = random.Random(SEED)
    limits = QueryLimits()
    admitted = 0
    refusals: list[str] = []
    slowest = 0.0
    for _ in range(FUZZ):
        sql = nested_statement(rng, rng.randint(1, 60))
        if rng.random() < 0.2:  # inside a larger statement, too
            sql = f"SELECT a FROM (VALUES (1)) t(a) WHERE a = ({sql}) OR a IS NULL"
        try:
            limits.check_text(sql, 0)
        except InvalidArgument as exc:
            refusals.append(str(exc))
            continue
        admitted += 1
        took = _plan_seconds(sql, PLAN_BOUND_S)
        assert took is not None, f"admitted but did not plan within {PLAN_BOUND_S}s: {sql}"
        slowest = max(slowest, took)
    print(f"admitted {admitted}, refused {len(refusals)}, slowest plan {slowest:.4f}s")
    assert admitted > FUZZ // 4
    assert len(refusals) > FUZZ // 4
    assert all("LAKE_QUERY_MAX_" in refusal for refusal in refusals)


def test_the_nesting_limit_comes_from_the_environment() -> None:
    assert QueryLimits.from_env({}).max_nesting_depth == 32
    assert QueryLimits.from_env({"LAKE_QUERY_MAX_NESTING_DEPTH": "8"}).max_nesting_depth == 8
    limits = QueryLimits.from_env({"LAKE_QUERY_MAX_NESTING_DEPTH": "8"})
    limits.check_text("SELECT " + nest(["paren"] * 7), 0)
    with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_NESTING_DEPTH"):
        limits.check_text("SELECT " + nest(["paren"] * 8), 0)
