"""Planning a statement again at the same snapshot skips DataFusion, with the same result.

ADBC prepares a statement (CreatePreparedStatement) and then executes it
(GetFlightInfo), which planned the SQL twice. A plain projection of one
Iceberg table planned before on the replica is planned again without
DataFusion when the table is still at that snapshot
(``Planner._plan_plain_external``). A differential test over generated
statements (projections, reorderings, aliases, expressions, filters, LIMIT,
ORDER BY, DISTINCT, joins, unknown columns and tables): a planner planning
each statement a second time returns exactly what a fresh planner returns
(spec, schema, partitions; or the same error). Then what must not be
reused: a newer snapshot is planned afresh, and a caller without the
namespace grant is refused as planning refuses it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from lake_core.errors import TableNotFound
from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_iceberg.federation import IcebergFederation
from lake_query.planning import Planner, QuerySpec
from lake_query.planning import planner as planning
from tools.lake_testing.iceberg import SeaweedIceberg, in_process_federation

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

NAMESPACE = "planonce"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "x", DoubleType(), required=False),
)
COLUMNS = ["id", "name", "x"]


@pytest.fixture(scope="module")
def federation(iceberg_server: SeaweedIceberg) -> Iterator[IcebergFederation]:
    catalog = iceberg_server.catalog()
    catalog.create_namespace(NAMESPACE)
    table = catalog.create_table((NAMESPACE, "t"), schema=SCHEMA)
    table.append(
        pa.table(
            {"id": list(range(20)), "name": [f"n{i}" for i in range(20)], "x": [0.5] * 20},
            schema=SCHEMA.as_arrow(),
        )
    )
    with in_process_federation(iceberg_server, NAMESPACE) as fed:
        yield fed


def _statement(rng: random.Random) -> str:
    table = f"iceberg.{NAMESPACE}.t"
    picked = rng.sample(COLUMNS, rng.randint(1, 3))
    shape = rng.choice(
        [
            "plain",
            "plain",
            "plain",
            "star",
            "alias",
            "expr",
            "where",
            "limit",
            "order",
            "distinct",
            "join",
            "unknown_column",
            "unknown_table",
            "repeat",
            "qualified",
        ]
    )
    columns = ", ".join(picked)
    if shape == "star":
        return f"SELECT * FROM {table}"
    if shape == "alias":
        return f"SELECT {picked[0]} AS renamed FROM {table}"
    if shape == "expr":
        return f"SELECT id + 1, {columns} FROM {table}"
    if shape == "where":
        return f"SELECT {columns} FROM {table} WHERE id < {rng.randint(0, 25)}"
    if shape == "limit":
        return f"SELECT {columns} FROM {table} LIMIT {rng.randint(0, 5)}"
    if shape == "order":
        return f"SELECT {columns} FROM {table} ORDER BY {picked[0]}"
    if shape == "distinct":
        return f"SELECT DISTINCT {columns} FROM {table}"
    if shape == "join":
        return f"SELECT a.id, b.name FROM {table} a JOIN {table} b ON a.id = b.id"
    if shape == "unknown_column":
        return f"SELECT nope FROM {table}"
    if shape == "unknown_table":
        return f"SELECT id FROM iceberg.{NAMESPACE}.missing"
    if shape == "repeat":
        return f"SELECT {picked[0]}, {picked[0]} FROM {table}"
    if shape == "qualified":
        return f"SELECT t.{picked[0]} FROM {table} t"
    return f"SELECT {columns} FROM {table}"


def _outcome(planner: Planner, sql: str, principal: Principal = DEV_PRINCIPAL) -> Any:
    try:
        planned = planner.plan(sql, principal)
    except Exception as exc:
        return ("error", type(exc).__name__)
    return (planned.spec, planned.schema, planned.partitions)


def test_planning_again_equals_a_fresh_plan_over_generated_statements(
    federation: IcebergFederation,
) -> None:
    planner = Planner(lambda ref: None, external=[federation])
    rng = random.Random(20261202)
    statements = [_statement(rng) for _ in range(80)]
    for sql in statements:
        first = _outcome(planner, sql)
        again = _outcome(planner, sql)
        fresh = _outcome(Planner(lambda ref: None, external=[federation]), sql)
        assert first == fresh, sql
        assert again == fresh, sql
    # Plain projections were remembered by their text: the second plans took the fast path.
    plain = {s for s in statements if planner._plain_statements.recall(QuerySpec(sql=s))}
    assert len(plain) >= 5, plain


def test_a_plain_projection_planned_again_skips_datafusion(
    federation: IcebergFederation, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = Planner(lambda ref: None, external=[federation])
    sql = f"SELECT name, id FROM iceberg.{NAMESPACE}.t"
    first = planner.plan(sql, DEV_PRINCIPAL)

    def no_datafusion(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("planned with DataFusion again")

    monkeypatch.setattr(planning, "_plan", no_datafusion)
    again = planner.plan(sql, DEV_PRINCIPAL)
    assert (again.spec, again.schema, again.partitions) == (
        first.spec,
        first.schema,
        first.partitions,
    )
    # The DoGet that follows reads it directly too.
    rows = pa.Table.from_batches(list(planner.execute(again.spec, DEV_PRINCIPAL)))
    assert sorted(rows.column("id").to_pylist()) == list(range(20))


def test_a_newer_snapshot_is_planned_afresh(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = Planner(lambda ref: None, external=[federation])
    sql = f"SELECT id FROM iceberg.{NAMESPACE}.t"
    before = planner.plan(sql, DEV_PRINCIPAL)
    table = iceberg_server.catalog().load_table((NAMESPACE, "t"))
    table.append(pa.table({"id": [100], "name": ["late"], "x": [1.0]}, schema=SCHEMA.as_arrow()))
    monkeypatch.setattr(federation.cache, "fresh_s", 0.0)  # as its 5 s freshness expiring
    after = planner.plan(sql, DEV_PRINCIPAL)
    fresh = Planner(lambda ref: None, external=[federation]).plan(sql, DEV_PRINCIPAL)
    assert after.spec.external[0].snapshot_id != before.spec.external[0].snapshot_id
    assert (after.spec, after.schema) == (fresh.spec, fresh.schema)
    rows = pa.Table.from_batches(list(planner.execute(after.spec, DEV_PRINCIPAL)))
    assert 100 in rows.column("id").to_pylist()


def test_a_caller_without_the_grant_is_refused_on_the_fast_path(
    federation: IcebergFederation,
) -> None:
    planner = Planner(lambda ref: None, external=[federation])
    sql = f"SELECT id, name FROM iceberg.{NAMESPACE}.t"
    planner.plan(sql, DEV_PRINCIPAL)
    outsider = Principal(
        principal_id="outsider", tenant_id="local", role="user", namespaces=frozenset({"other"})
    )
    with pytest.raises(TableNotFound):
        planner.plan(sql, outsider)
    fresh = Planner(lambda ref: None, external=[federation])
    with pytest.raises(TableNotFound):
        fresh.plan(sql, outsider)


def test_a_schema_change_without_a_new_snapshot_is_planned_afresh(
    iceberg_server: SeaweedIceberg, federation: IcebergFederation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that adds no snapshot (a schema change) is a new metadata version."""
    catalog = iceberg_server.catalog()
    table = catalog.create_table((NAMESPACE, "evolving"), schema=SCHEMA)
    table.append(pa.table({"id": [1], "name": ["a"], "x": [1.0]}, schema=SCHEMA.as_arrow()))
    planner = Planner(lambda ref: None, external=[federation])
    sql = f"SELECT * FROM iceberg.{NAMESPACE}.evolving"
    before = planner.plan(sql, DEV_PRINCIPAL)
    with catalog.load_table((NAMESPACE, "evolving")).update_schema() as update:
        update.add_column("added", LongType())
    monkeypatch.setattr(federation.cache, "fresh_s", 0.0)  # as its 5 s freshness expiring
    after = planner.plan(sql, DEV_PRINCIPAL)
    fresh = Planner(lambda ref: None, external=[federation]).plan(sql, DEV_PRINCIPAL)
    assert after.spec.external == before.spec.external  # the same snapshot
    assert (after.spec, after.schema) == (fresh.spec, fresh.schema)
