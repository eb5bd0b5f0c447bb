"""Differential: Lake's integer arithmetic against Python's integers (issue 36 item 3).

A seeded generator builds integer expressions over BIGINT and INT columns
and literals (``+``, ``-``, ``*``, unary ``-``; constant-only ones too, which
the optimizer folds) and aggregates over them (plain, and running window sums). Python evaluates each node
exactly and checks it against its SQL type's range (DataFusion's typing: a
literal is BIGINT, INT with INT stays INT). Where every value fits, Lake
returns exactly Python's answer; where one does not, Lake raises
IntegerOverflow. DataFusion evaluates every node for every row, so any row
overflowing anywhere fails the statement.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pyarrow as pa
import pytest

from lake_core.errors import IntegerOverflow
from lake_core.principal import DEV_PRINCIPAL
from lake_query.planning import Planner

from .conftest import LocalCatalog

RANGES = {"int64": (-(2**63), 2**63 - 1), "int32": (-(2**31), 2**31 - 1)}
SEED = 3603
CASES = 120


class Overflow(Exception):
    pass


@dataclass(frozen=True)
class Node:
    sql: str
    type: str  # "int64" | "int32"
    op: str = ""  # "", "+", "-", "*", "neg"
    children: tuple[Node, ...] = ()
    column: str | None = None
    value: int | None = None

    def eval(self, row: dict[str, int]) -> int:
        if self.column is not None:
            return row[self.column]
        if self.value is not None:
            return self.value
        args = [c.eval(row) for c in self.children]
        if self.op == "neg":
            result = -args[0]
        elif self.op == "+":
            result = args[0] + args[1]
        elif self.op == "-":
            result = args[0] - args[1]
        else:
            result = args[0] * args[1]
        low, high = RANGES[self.type]
        if not low <= result <= high:
            raise Overflow
        return result


def rows(rng: random.Random) -> list[dict[str, int]]:
    edge64 = [0, 1, -1, 2, 2**62, 2**63 - 1, -(2**63), -(2**63) + 1, 3037000499, -3037000500]
    edge32 = [0, 1, -1, 46340, -46341, 2**31 - 1, -(2**31), 65536]
    out = []
    for i in range(8):
        out.append(
            {
                "a": edge64[i % len(edge64)],
                "b": rng.randint(-(2**40), 2**40),
                "c": rng.randint(-1000, 1000),
                "x": edge32[i % len(edge32)],
                "y": rng.randint(-(2**16), 2**16),
            }
        )
    return out


COLUMNS = {"a": "int64", "b": "int64", "c": "int64", "x": "int32", "y": "int32"}


def literal(rng: random.Random) -> Node:
    value = rng.choice(
        [rng.randint(-10, 10), rng.randint(-(2**31), 2**31), rng.randint(-(2**63) + 1, 2**63 - 1)]
    )
    return Node(f"({value})", "int64", value=value)


def expression(rng: random.Random, depth: int, constant: bool = False) -> Node:
    if depth == 0 or rng.random() < 0.25:
        if constant or rng.random() < 0.3:
            return literal(rng)
        name = rng.choice(sorted(COLUMNS))
        return Node(name, COLUMNS[name], column=name)
    if rng.random() < 0.15:
        inner = expression(rng, depth - 1, constant)
        return Node(f"(-{inner.sql})", inner.type, "neg", (inner,))
    op = rng.choice("+-*")
    left, right = expression(rng, depth - 1, constant), expression(rng, depth - 1, constant)
    kind = "int32" if left.type == right.type == "int32" else "int64"
    return Node(f"({left.sql} {op} {right.sql})", kind, op, (left, right))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Planner, list[dict[str, int]]]:
    catalog = LocalCatalog(tmp_path_factory.mktemp("tables"))
    data = rows(random.Random(SEED))
    catalog.create(
        "robots.gen",
        pa.table({name: pa.array([r[name] for r in data], COLUMNS[name]) for name in COLUMNS}),
    )
    return Planner(catalog.resolve, catalog.refs), data


def lake(planner: Planner, sql: str) -> list[object]:
    planned = planner.plan(sql, DEV_PRINCIPAL)
    stream = planner.execute(planned.spec, DEV_PRINCIPAL)
    table = pa.Table.from_batches(list(stream), schema=stream.schema)
    return table.column(0).to_pylist()


def python(values: list[dict[str, int]], node: Node, aggregate: bool) -> list[int] | None:
    """Python's answer, or None for an overflow anywhere."""
    try:
        results = [node.eval(row) for row in values]
    except Overflow:
        return None
    if not aggregate:
        return results
    total = sum(results)
    low, high = RANGES["int64"]
    return [total] if low <= total <= high else None


def running(values: list[dict[str, int]], node: Node) -> list[int] | None:
    """Python's running sums of ``node``, or None where any value or prefix overflows."""
    each = python(values, node, False)
    if each is None:
        return None
    low, high = RANGES["int64"]
    totals, total = [], 0
    for value in each:
        total += value
        if not low <= total <= high:
            return None
        totals.append(total)
    return totals


def test_generated_expressions_agree_with_python(
    world: tuple[Planner, list[dict[str, int]]],
) -> None:
    planner, values = world
    rng = random.Random(SEED + 1)
    overflowed = agreed = 0
    for _ in range(CASES):
        aggregate = rng.random() < 0.3
        constant = rng.random() < 0.15
        window = rng.random() < 0.15
        node = expression(rng, rng.randint(1, 3), constant)
        if window and not constant:
            sql = (
                f"SELECT sum({node.sql}) OVER (ORDER BY a, b ROWS UNBOUNDED PRECEDING) AS v "
                "FROM robots.gen ORDER BY a, b"
            )
            ordered = sorted(values, key=lambda r: (r["a"], r["b"]))
            expected = running(ordered, node)
        elif constant:
            sql = f"SELECT {node.sql} AS v"
            expected = python([{}], node, False)
        elif aggregate:
            sql = f"SELECT sum({node.sql}) AS v FROM robots.gen"
            expected = python(values, node, True)
        else:
            sql = f"SELECT {node.sql} AS v FROM robots.gen ORDER BY a, b"
            ordered = sorted(values, key=lambda r: (r["a"], r["b"]))
            expected = python(ordered, node, False)
        if expected is None:
            with pytest.raises(IntegerOverflow):
                lake(planner, sql)
            overflowed += 1
        else:
            assert lake(planner, sql) == expected, sql
            agreed += 1
    print(f"{agreed} agreed, {overflowed} overflowed")
    # The generator exercises both outcomes, not just one.
    assert overflowed >= CASES // 5, (overflowed, agreed)
    assert agreed >= CASES // 5, (overflowed, agreed)


def test_sum_of_in_range_values_that_overflows(
    world: tuple[Planner, list[dict[str, int]]],
) -> None:
    planner, values = world
    big = [r["a"] for r in values if r["a"] > 0]
    sql = "SELECT sum(a) AS v FROM robots.gen WHERE a > 0"
    assert all(v <= 2**63 - 1 for v in big)
    assert sum(big) > 2**63 - 1
    with pytest.raises(IntegerOverflow, match=r"integer overflow in sum \(int64\)"):
        lake(planner, sql)
    small = "SELECT sum(c) AS v, sum(x) AS w FROM robots.gen"
    planned = planner.plan(small, DEV_PRINCIPAL)
    stream = planner.execute(planned.spec, DEV_PRINCIPAL)
    got = pa.Table.from_batches(list(stream), schema=stream.schema).to_pylist()
    assert got == [{"v": sum(r["c"] for r in values), "w": sum(r["x"] for r in values)}]


def test_generated_expressions_in_correlated_subqueries_agree_with_python(
    world: tuple[Planner, list[dict[str, int]]],
) -> None:
    """The same expressions inside a correlated EXISTS, constant-only ones included.

    DataFusion decorrelates the subquery into a semi join whose inner filter
    is the expression's test, evaluated for every row of the inner table:
    any row overflowing fails the statement; otherwise every outer row
    matches itself.
    """
    planner, values = world
    rng = random.Random(SEED + 2)
    outcomes = {"agreed": 0, "overflowed": 0}
    for _ in range(CASES // 3):
        constant = rng.random() < 0.4
        node = expression(rng, rng.randint(1, 3), constant)
        inner = node.sql
        for name in COLUMNS:  # the inner table's columns, not the outer ones
            inner = re_column(name).sub(f"h.{name}", inner)
        sql = (
            "SELECT g.a FROM robots.gen g WHERE EXISTS (SELECT 1 FROM robots.gen h "
            f"WHERE h.a = g.a AND ({inner}) IS NOT NULL) ORDER BY g.a"
        )
        expected = python([{}] if constant else values, node, False)
        if expected is None:
            with pytest.raises(IntegerOverflow):
                lake(planner, sql)
            outcomes["overflowed"] += 1
        else:
            assert lake(planner, sql) == sorted(r["a"] for r in values), sql
            outcomes["agreed"] += 1
    assert min(outcomes.values()) >= CASES // 15, outcomes


def re_column(name: str) -> re.Pattern[str]:
    """A bare column name in generated SQL (literals are parenthesised numbers)."""
    return re.compile(rf"(?<![\w.]){name}(?!\w)")
