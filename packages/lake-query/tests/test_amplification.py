"""Values grown by concatenation are bounded before the statement runs.

The plan walk (:mod:`lake_query.planning.amplification`) counts how many
bounded units a value may hold; past the query's memory share the statement
is refused with QueryTooLarge (RESOURCE_EXHAUSTED) while ordinary
concatenations, string_agg and recursive CTEs keep their exact answers.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from lake_core.errors import QueryTooLarge
from lake_core.principal import DEV_PRINCIPAL
from lake_query.planning import Planner, QueryLimits

from .conftest import LocalCatalog


def doubling(depth: int, source: str = "SELECT repeat('x', 50000000) AS s") -> str:
    """Each CTE level doubles the value of the one before."""
    ctes = [f"c0 AS ({source})"]
    ctes += [f"c{i} AS (SELECT s || s AS s FROM c{i - 1})" for i in range(1, depth + 1)]
    return "WITH " + ", ".join(ctes) + f" SELECT length(s) FROM c{depth}"


def linear(operands: int, size: int = 50_000_000) -> str:
    return "SELECT length(" + " || ".join([f"repeat('x', {size})"] * operands) + ")"


DOUBLING_12 = doubling(12)
LINEAR_400 = linear(400)


@pytest.fixture
def planner(catalog: LocalCatalog) -> Planner:
    return Planner(catalog.resolve, catalog.refs)


def rows(planner: Planner, sql: str) -> list[dict[str, object]]:
    planned = planner.plan(sql, DEV_PRINCIPAL)
    stream = planner.execute(planned.spec, DEV_PRINCIPAL)
    return pa.Table.from_batches(list(stream), schema=stream.schema).to_pylist()


@pytest.mark.parametrize(
    "sql",
    [
        DOUBLING_12,
        LINEAR_400,
        doubling(3),  # 400 MB: past the 512 MiB share with its intermediates
        linear(4),
        doubling(12, "SELECT robot AS s FROM robots.episodes"),
        "SELECT " + " || ".join(["robot"] * 100) + " FROM robots.episodes",
        "SELECT concat(" + ", ".join(["repeat('y', 40000000)"] * 20) + ")",
        # A constant is folded once and then copied into every row of a batch.
        "SELECT repeat('x', 20000000) || robot FROM robots.episodes",
        # A recursive term holding its input twice doubles at every iteration.
        "WITH RECURSIVE r AS (SELECT 'x' AS s UNION ALL SELECT s || s AS s FROM r) "
        "SELECT length(s) FROM r",
        # A one-row side of a join is copied into every row of the other.
        "SELECT e.episode_id, g.names FROM robots.episodes e CROSS JOIN "
        "(SELECT string_agg(robot, ',') AS names FROM robots.episodes) g",
        # A computed value (one row may hold a whole batch's bound) copied by a join.
        "WITH x AS (SELECT episode_id, repeat(robot, 3) AS r FROM robots.episodes) "
        "SELECT x.r FROM x JOIN robots.episodes e ON x.episode_id = e.episode_id",
        "SELECT replace(robot, 'o', robot) FROM robots.episodes",
        # Subquery plans are not walked: one computing large values is refused.
        "SELECT episode_id FROM robots.episodes WHERE EXISTS (SELECT length("
        + " || ".join(["repeat('x', 50000000)"] * 6)
        + "))",
        # Accumulated over rows no table bounds (this one took a replica down).
        "SELECT length(string_agg(repeat('x', 5000 + value % 10), ',')) FROM "
        "(SELECT unnest(range(1, 8000)) AS value) CROSS JOIN (SELECT unnest(range(1, 30)) AS w)",
    ],
    ids=[
        "doubling-12",
        "linear-400",
        "doubling-3",
        "linear-4",
        "stored-doubling-12",
        "stored-linear-100",
        "concat-20",
        "broadcast",
        "recursive-doubling",
        "joined-aggregate",
        "joined-computed",
        "column-replacement",
        "subquery",
        "aggregate-of-computed",
    ],
)
def test_amplifying_statements_are_refused_before_they_run(planner: Planner, sql: str) -> None:
    with pytest.raises(QueryTooLarge, match="LAKE_QUERY_MEMORY_LIMIT_BYTES") as refused:
        planner.plan(sql, DEV_PRINCIPAL)
    assert refused.value.retryable is False
    assert rows(planner, "SELECT count(*) AS n FROM robots.episodes") == [{"n": 20_000}]


def test_ordinary_concatenations_keep_their_answers(planner: Planner) -> None:
    got = rows(
        planner,
        "SELECT robot || '-' || cast(episode_id AS varchar) AS k, concat(robot, ':', ok) AS c, "
        "concat_ws('/', robot, robot, 'z') AS w, replace(robot, 'robot', 'r') AS r, "
        "upper(robot) || lower(robot) AS u, robot || robot || robot AS t "
        "FROM robots.episodes WHERE episode_id < 3 ORDER BY episode_id",
    )
    expected = []
    for i in range(3):
        robot = f"robot-{i % 7}"
        expected.append(
            {
                "k": f"{robot}-{i}",
                "c": f"{robot}:{str(i % 3 != 0).lower()}",
                "w": f"{robot}/{robot}/z",
                "r": f"r-{i % 7}",
                "u": robot.upper() + robot,
                "t": robot * 3,
            }
        )
    assert got == expected


def test_doubling_within_the_share_still_answers(planner: Planner) -> None:
    # Two levels of a 1 MB value, and eight copies of a stored column.
    assert rows(planner, doubling(2, "SELECT repeat('x', 1000000) AS s")) == [
        {"length(c2.s)": 4_000_000}
    ]
    got = rows(
        planner,
        "SELECT " + " || ".join(["robot"] * 8) + " AS s FROM robots.episodes WHERE episode_id = 5",
    )
    assert got == [{"s": "robot-5" * 8}]


def test_string_agg_and_recursive_ctes_keep_their_answers(planner: Planner) -> None:
    got = rows(
        planner,
        "SELECT robot, string_agg(cast(episode_id AS varchar), ',' ORDER BY episode_id) AS ids "
        "FROM robots.episodes WHERE episode_id < 15 GROUP BY robot ORDER BY robot",
    )
    expected = [
        {"robot": f"robot-{r}", "ids": ",".join(str(i) for i in range(15) if i % 7 == r)}
        for r in range(7)
    ]
    assert got == expected
    path = rows(
        planner,
        "WITH RECURSIVE r AS (SELECT 1 AS n, 'a' AS p UNION ALL "
        "SELECT n + 1 AS n, p || '/a' AS p FROM r WHERE n < 4) SELECT n, p FROM r ORDER BY n",
    )
    assert path == [{"n": n, "p": "/".join(["a"] * n)} for n in range(1, 5)]
    subquery = rows(
        planner,
        "SELECT count(*) AS n FROM robots.episodes WHERE robot || '' IN "
        "(SELECT robot || robot FROM robots.episodes) OR episode_id < 4",
    )
    assert subquery == [{"n": 4}]


def test_the_bound_follows_the_memory_share(catalog: LocalCatalog) -> None:
    # Two 50 MB values fit a 512 MiB share; a 128 MiB share refuses them.
    sql = linear(2)
    Planner(catalog.resolve, catalog.refs).plan(sql, DEV_PRINCIPAL)
    small = Planner(catalog.resolve, catalog.refs, limits=QueryLimits(query_memory_bytes=128 << 20))
    with pytest.raises(QueryTooLarge):
        small.plan(sql, DEV_PRINCIPAL)
    off = Planner(catalog.resolve, catalog.refs, limits=QueryLimits(enforce=False))
    off.plan(DOUBLING_12, DEV_PRINCIPAL)  # the guard is part of the limits it turns off
