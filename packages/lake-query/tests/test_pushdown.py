"""Filtered scans answered by Lance alone must return exactly what SQL says.

The oracle is DataFusion itself over the same rows held in memory: for every
WHERE clause, Lake's result (through the Planner, which hands translatable
filters to Lance's scanner) must equal DataFusion's, nulls included.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import lance
import pyarrow as pa
import pytest
from datafusion import SessionContext

from lake_core.filetype import FILE_STRUCT, file_field
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_query.planning import Planner
from lake_query.planning.pushdown import to_lance_filter

from .conftest import LocalCatalog

ROWS = 200
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("score", pa.float64()),
        ("robot", pa.utf8()),
        ("ok", pa.bool_()),
        ("at", pa.timestamp("us", tz="UTC")),
        file_field("video"),
    ]
)
BASE = datetime(2026, 1, 1, tzinfo=UTC)


def data() -> pa.Table:
    def maybe(i: int, value: object) -> object:
        return None if i % 7 == 0 else value

    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "score": pa.array([maybe(i, (i % 13) / 4) for i in range(ROWS)], pa.float64()),
            "robot": pa.array([maybe(i + 1, f"robot-{i % 5}") for i in range(ROWS)], pa.utf8()),
            "ok": pa.array([maybe(i + 2, i % 3 == 0) for i in range(ROWS)], pa.bool_()),
            "at": pa.array(
                [BASE + timedelta(seconds=i) for i in range(ROWS)], pa.timestamp("us", tz="UTC")
            ),
            # A FILE column (it holds unsigned integers): filters must still reach Lance.
            "video": pa.array([None] * ROWS, FILE_STRUCT),
        },
        schema=SCHEMA,
    )


WHERE = [
    "id = 17",
    "id IN (3, 5, 8, 13, 21, 34, 55, 89, 144)",
    "id IN (3, 5) OR score > 2.5",
    "score >= 1.5 AND score < 2.5",
    "score != 1.0",
    "NOT (score > 1.0)",
    "NOT (score > 1.0 OR id < 10)",
    "robot = 'robot-3'",
    "robot = 'it''s' OR id = 1",
    "robot IN ('robot-1', 'robot-2')",
    "robot NOT IN ('robot-1', 'robot-2')",
    "NOT (robot IN ('robot-1'))",
    "ok",
    "NOT ok",
    "ok = false",
    "score IS NULL",
    "robot IS NOT NULL AND id > 150",
    "at > TIMESTAMP '2026-01-01T00:02:00Z'",
    "id BETWEEN 20 AND 40",
    "id % 2 = 0",
    "score IS NULL OR robot = 'robot-0'",
]


@pytest.fixture
def table(catalog: LocalCatalog) -> None:
    catalog.create("robots.scores", data())


@pytest.mark.parametrize("where", WHERE)
def test_filtered_scans_match_sql(table: None, catalog: LocalCatalog, where: str) -> None:
    planner = Planner(catalog.resolve, catalog.refs)
    sql = f"SELECT * FROM robots.scores WHERE {where}"
    planned = planner.plan(sql, DEV_PRINCIPAL)
    stream = planner.execute(planned.spec, DEV_PRINCIPAL)  # the plan this replica kept
    got = pa.Table.from_batches(list(stream), schema=stream.schema).sort_by("id")
    # Another replica redeems the same ticket by planning it afresh.
    elsewhere = Planner(catalog.resolve, catalog.refs).execute(planned.spec, DEV_PRINCIPAL)
    assert pa.Table.from_batches(list(elsewhere), schema=elsewhere.schema).sort_by("id") == got
    assert stream.schema == planned.schema == elsewhere.schema

    oracle = SessionContext()
    oracle.from_arrow(data(), name="scores")
    want = oracle.sql(f"SELECT * FROM scores WHERE {where}").to_arrow_table().sort_by("id")
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    assert got.equals(want.cast(got.schema))


def test_simple_filters_are_translated_and_others_are_not(
    table: None, catalog: LocalCatalog
) -> None:
    dataset = lance.dataset(catalog.location(TableRef("robots", "scores")))
    context = SessionContext()
    context.register_table("t", lance.FFILanceTableProvider(dataset))

    def translated(where: str) -> bool:
        # The plan as Query reads it: Projection, Filter, TableScan.
        plan = context.sql(f"SELECT * FROM t WHERE {where}").logical_plan()
        predicate = plan.to_variant().input()[0].to_variant().predicate()
        return to_lance_filter([predicate], dataset.schema) is not None

    assert translated("id IN (3, 5, 8)")
    assert translated("score >= 1.5 AND robot = 'robot-3'")
    assert translated("score IS NULL OR NOT ok")
    many = ", ".join(f"'robot-{i}'" for i in range(40))
    assert translated(f"robot NOT IN ({many})")  # Lance's SQL keeps SQL's NULL semantics
    assert translated("robot = 'it''s'")
    assert not translated("id % 2 = 0")  # arithmetic: DataFusion runs it
    assert not translated("robot LIKE 'robot-1%'")
    assert not translated(
        "at > TIMESTAMP '2026-01-01T00:02:00Z'"
    )  # timestamps stay with DataFusion
