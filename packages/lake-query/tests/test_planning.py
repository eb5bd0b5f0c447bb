"""Planning pins every referenced table; execution reads the pins alone."""

from __future__ import annotations

from pathlib import Path

import grpc
import lance
import pyarrow as pa
import pytest
from datafusion import SessionContext

from lake_core.errors import (
    READ_ONLY_MESSAGE,
    InvalidName,
    PermissionDenied,
    ReadOnlySql,
    SqlError,
    TableNotFound,
    VersionReclaimed,
)
from lake_core.models import CatalogEntry
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_query.planning import DatasetOpener, Planner, QueryLimits, QuerySpec
from lake_query.planning.batches import MAX_BATCH_BYTES
from lake_query.planning.catalog import PlanningBinder, session
from lake_query.planning.functions import FunctionBudget
from lake_query.planning.planner import _plan

from .conftest import EPISODES_ROWS, ROBOTS_ONLY, LocalCatalog, episodes, rewards
from .test_statements import WRITES


class CountingResolver:
    def __init__(self, catalog: LocalCatalog) -> None:
        self.catalog = catalog
        self.asked: list[TableRef] = []

    def __call__(self, ref: TableRef) -> CatalogEntry | None:
        self.asked.append(ref)
        return self.catalog.resolve(ref)


@pytest.fixture
def resolver(catalog: LocalCatalog) -> CountingResolver:
    return CountingResolver(catalog)


@pytest.fixture
def planner(resolver: CountingResolver, catalog: LocalCatalog) -> Planner:
    return Planner(resolver, catalog.refs)


def rows(planner: Planner, spec: QuerySpec) -> pa.Table:
    stream = planner.execute(spec, DEV_PRINCIPAL)
    return pa.Table.from_batches(list(stream), schema=stream.schema)


def pinned_names(spec: QuerySpec) -> list[str]:
    return [str(p.table) for p in spec.pins]


JOIN_SUBQUERY_CTE = """
    WITH good AS (SELECT episode_id FROM robots.rewards WHERE reward >= 50)
    SELECT e.robot, count(*) AS n
    FROM lake.robots.episodes e JOIN good g ON e.episode_id = g.episode_id
    WHERE e.episode_id IN (SELECT episode_id FROM robots.rewards WHERE reward < 90)
    GROUP BY e.robot ORDER BY e.robot
"""


def test_join_subquery_and_cte_tables_are_all_pinned(
    planner: Planner, catalog: LocalCatalog
) -> None:
    planned = planner.plan(JOIN_SUBQUERY_CTE, DEV_PRINCIPAL)
    assert pinned_names(planned.spec) == ["robots.episodes", "robots.rewards"]
    for pin in planned.spec.pins:
        assert pin.descriptor == catalog.entries[pin.table].descriptor
    assert planned.schema.names == ["robot", "n"]
    result = rows(planner, planned.spec)
    assert result.num_rows == 7
    assert sum(result.column("n").to_pylist()) == EPISODES_ROWS * 40 // 100


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM robots.episodes WHERE episode_id IN "
        "(SELECT episode_id FROM robots.rewards)",
        "WITH r AS (SELECT * FROM robots.rewards) SELECT count(*) FROM r",
        "SELECT (SELECT max(reward) FROM robots.rewards) AS m",
        "SELECT count(*) FROM robots.episodes WHERE EXISTS "
        "(SELECT 1 FROM lake.robots.rewards r WHERE r.episode_id = episodes.episode_id)",
    ],
)
def test_tables_referenced_only_inside_subqueries_or_ctes_are_pinned(
    planner: Planner, sql: str
) -> None:
    planned = planner.plan(sql, DEV_PRINCIPAL)
    assert "robots.rewards" in pinned_names(planned.spec)


def test_namespace_dot_table_uses_lake_as_default_catalog(planner: Planner) -> None:
    short = planner.plan("SELECT count(*) AS n FROM robots.episodes", DEV_PRINCIPAL)
    full = planner.plan("SELECT count(*) AS n FROM lake.robots.episodes", DEV_PRINCIPAL)
    assert short.spec.pins == full.spec.pins
    assert rows(planner, short.spec).column("n").to_pylist() == [EPISODES_ROWS]


def test_a_pin_survives_an_append(planner: Planner, catalog: LocalCatalog) -> None:
    planned = planner.plan("SELECT * FROM robots.episodes", DEV_PRINCIPAL)
    catalog.append("robots.episodes", episodes(EPISODES_ROWS, 500))

    # The ticket round trip: only the serialized spec reaches execution.
    spec = QuerySpec.model_validate_json(planned.spec.model_dump_json())
    result = rows(planner, spec)
    assert result.num_rows == EPISODES_ROWS
    assert result.schema.equals(planned.schema)
    assert max(result.column("episode_id").to_pylist()) == EPISODES_ROWS - 1

    fresh = planner.plan("SELECT * FROM robots.episodes", DEV_PRINCIPAL)
    assert rows(planner, fresh.spec).num_rows == EPISODES_ROWS + 500


def test_execution_never_consults_the_resolver(
    planner: Planner, resolver: CountingResolver
) -> None:
    planned = planner.plan(JOIN_SUBQUERY_CTE, DEV_PRINCIPAL)
    resolver.asked.clear()
    rows(planner, planned.spec)
    assert resolver.asked == []


def test_reclaimed_version_fails_and_never_falls_forward(
    planner: Planner, catalog: LocalCatalog
) -> None:
    planned = planner.plan("SELECT * FROM robots.rewards", DEV_PRINCIPAL)
    for i in range(3):
        catalog.append("robots.rewards", rewards(EPISODES_ROWS + i, 1))
    location = catalog.entries[TableRef("robots", "rewards")].descriptor.location
    lance.dataset(location).cleanup_old_versions(
        older_than=pd_zero(), retain_versions=1, error_if_tagged_old_versions=False
    )
    with pytest.raises(VersionReclaimed) as caught:
        rows(planner, planned.spec)
    assert "lake.robots.rewards" in str(caught.value)
    assert caught.value.grpc_status == grpc.StatusCode.FAILED_PRECONDITION


def test_recreated_table_is_a_different_incarnation(
    planner: Planner, catalog: LocalCatalog
) -> None:
    planned = planner.plan("SELECT * FROM robots.rewards", DEV_PRINCIPAL)
    # Same location, Lance version numbers restart: only the incarnation tells.
    catalog.create("robots.rewards", rewards(0, 10))
    with pytest.raises(VersionReclaimed, match="dropped and recreated"):
        rows(planner, planned.spec)


@pytest.mark.parametrize("sql", WRITES)
def test_writes_are_read_only_without_lookups(
    planner: Planner, resolver: CountingResolver, sql: str
) -> None:
    with pytest.raises(ReadOnlySql) as caught:
        planner.plan(sql, DEV_PRINCIPAL)
    assert str(caught.value) == READ_ONLY_MESSAGE
    assert resolver.asked == []


def test_with_insert_is_read_only(planner: Planner) -> None:
    with pytest.raises(ReadOnlySql):
        planner.plan(
            "WITH x AS (SELECT 1) INSERT INTO robots.rewards SELECT * FROM x", DEV_PRINCIPAL
        )


def test_copy_to_writes_no_file(planner: Planner, tmp_path: Path) -> None:
    target = tmp_path / "leak.csv"
    sql = f"COPY (SELECT episode_id FROM robots.episodes) TO '{target}' STORED AS CSV"
    with pytest.raises(ReadOnlySql):
        planner.plan(sql, DEV_PRINCIPAL)
    with pytest.raises(ReadOnlySql):
        planner.execute(QuerySpec(sql=sql), DEV_PRINCIPAL)
    assert not target.exists()
    # The check can fail: unguarded DataFusion writes the file when run.
    unguarded = tmp_path / "unguarded.csv"
    SessionContext().sql(f"COPY (SELECT 1 AS x) TO '{unguarded}' STORED AS CSV").collect()
    assert unguarded.exists()


def test_malformed_sql_keeps_datafusion_message(planner: Planner) -> None:
    with pytest.raises(SqlError) as caught:
        planner.plan("SELEC episode_id FROM robots.episodes", DEV_PRINCIPAL)
    assert "ParserError" in str(caught.value)
    assert caught.value.grpc_status == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(SqlError, match="nope"):
        planner.plan("SELECT nope FROM robots.episodes", DEV_PRINCIPAL)


def test_unknown_table_is_not_found_and_named(planner: Planner) -> None:
    with pytest.raises(TableNotFound) as caught:
        planner.plan("SELECT * FROM robots.missing", DEV_PRINCIPAL)
    assert "lake.robots.missing" in str(caught.value)
    assert caught.value.grpc_status == grpc.StatusCode.NOT_FOUND
    with pytest.raises(TableNotFound, match=r"lake\.public\.episodes"):
        planner.plan("SELECT * FROM episodes", DEV_PRINCIPAL)
    with pytest.raises(TableNotFound, match=r"other\.robots\.episodes"):
        planner.plan("SELECT * FROM other.robots.episodes", DEV_PRINCIPAL)


@pytest.mark.parametrize(
    ("sql", "missing"),
    [
        ("SELECT * FROM other.robots.episodes", "other.robots.episodes"),
        ("SELECT * FROM OTHER.Robots.Episodes", "other.robots.episodes"),
        ('SELECT * FROM "Other".robots.episodes', "Other.robots.episodes"),
        ("DESCRIBE nowhere.robots.episodes", "nowhere.robots.episodes"),
        ("SELECT * FROM robots.episodes e JOIN x.y.z ON true", "x.y.z"),
        ("WITH q AS (SELECT * FROM other.a.b) SELECT * FROM q", "other.a.b"),
        (
            "SELECT count(*) FROM robots.episodes WHERE episode_id IN "
            "(SELECT episode_id FROM iceberg.robots.rewards)",
            "iceberg.robots.rewards",
        ),
        ("SELECT (SELECT max(reward) FROM robots.absent) AS m", "lake.robots.absent"),
        ("EXPLAIN SELECT * FROM datafusion.public.t", "datafusion.public.t"),
    ],
)
def test_a_missing_table_is_named_from_the_lookup_not_the_message(
    planner: Planner, sql: str, missing: str
) -> None:
    with pytest.raises(TableNotFound) as caught:
        planner.plan(sql, DEV_PRINCIPAL)
    assert caught.value.table == missing
    assert str(caught.value) == f"table not found: {missing}"
    assert caught.value.grpc_status == grpc.StatusCode.NOT_FOUND


def test_the_catalog_records_the_tables_it_could_not_resolve(catalog: LocalCatalog) -> None:
    binder = PlanningBinder(DEV_PRINCIPAL, DatasetOpener(), catalog.resolve, catalog.refs)
    ctx = session(binder, FunctionBudget(1 << 20))
    assert binder.missing_table() is None
    with pytest.raises(TableNotFound):
        ctx.sql("SELECT * FROM robots.episodes JOIN other.robots.rewards USING (episode_id)")
    with pytest.raises(TableNotFound):
        ctx.sql("SELECT * FROM robots.absent")
    assert binder.missing == ["other.robots.rewards", "lake.robots.absent"]
    # Listings name only the catalogs that exist; an absent one lists nothing.
    assert ctx.catalog_names() == {"lake"}
    # The record alone is enough: DataFusion may hand a failed lookup back as text.
    recorded = binder.missing_table()
    assert isinstance(recorded, TableNotFound)
    assert recorded.table == "other.robots.rewards"


class TextOnly:
    """A session whose planning failed with DataFusion's text alone (no Lake error)."""

    def sql_with_options(self, sql: str, options: object) -> None:
        raise ValueError("Error during planning: table 'other.robots.rewards' not found")


def test_planning_names_a_missing_table_from_the_record(catalog: LocalCatalog) -> None:
    binder = PlanningBinder(DEV_PRINCIPAL, DatasetOpener(), catalog.resolve, catalog.refs)
    spec = QuerySpec(sql="SELECT * FROM other.robots.rewards")
    with pytest.raises(SqlError):  # nothing recorded: DataFusion's text, not read
        _plan(TextOnly(), spec, QueryLimits(), binder)  # type: ignore[arg-type]
    binder.not_found("other.robots.rewards")
    with pytest.raises(TableNotFound) as caught:
        _plan(TextOnly(), spec, QueryLimits(), binder)  # type: ignore[arg-type]
    assert caught.value.table == "other.robots.rewards"


def test_hidden_and_absent_tables_get_the_same_denial(
    planner: Planner, resolver: CountingResolver
) -> None:
    messages = []
    for table in ("secret.plans", "secret.absent"):
        with pytest.raises(PermissionDenied) as caught:
            planner.plan(f"SELECT * FROM {table}", ROBOTS_ONLY)
        messages.append(str(caught.value).replace(table, "<t>"))
    assert messages[0] == messages[1]
    assert all(ref.namespace != "secret" for ref in resolver.asked)
    assert planner.plan("SELECT * FROM robots.rewards", ROBOTS_ONLY).spec.pins


def test_execution_reauthorizes_the_caller(planner: Planner) -> None:
    planned = planner.plan("SELECT * FROM secret.plans", DEV_PRINCIPAL)
    with pytest.raises(PermissionDenied):
        planner.execute(planned.spec, ROBOTS_ONLY)


def test_invalid_names_fail_before_any_lookup(planner: Planner, resolver: CountingResolver) -> None:
    for sql in ('SELECT * FROM "Robots".episodes', "SELECT * FROM '/etc/passwd'"):
        with pytest.raises(InvalidName):
            planner.plan(sql, DEV_PRINCIPAL)
    assert resolver.asked == []


def test_results_come_in_one_to_four_megabyte_batches(planner: Planner) -> None:
    planned = planner.plan(
        "SELECT a.*, b.reward, repeat(a.robot, 20) AS pad FROM robots.episodes a "
        "CROSS JOIN (SELECT reward FROM robots.rewards LIMIT 10) b",
        DEV_PRINCIPAL,
    )
    batches = list(planner.execute(planned.spec, DEV_PRINCIPAL))
    assert sum(b.num_rows for b in batches) == EPISODES_ROWS * 10
    assert len(batches) > 2
    for batch in batches[:-1]:
        assert 1024 * 1024 <= batch.nbytes <= MAX_BATCH_BYTES
    assert all(b.schema.equals(planned.schema) for b in batches)


def test_parameters_bind_positionally(planner: Planner) -> None:
    params = pa.RecordBatch.from_pydict({"0": pa.array([5], pa.int64())})
    planned = planner.plan(
        "SELECT episode_id FROM robots.episodes WHERE episode_id < $1", DEV_PRINCIPAL, params
    )
    spec = QuerySpec.model_validate_json(planned.spec.model_dump_json())
    assert rows(planner, spec).column("episode_id").to_pylist() == [0, 1, 2, 3, 4]


def pd_zero() -> object:
    from datetime import timedelta

    return timedelta(0)


def test_joins_across_tables_run(planner: Planner) -> None:
    # DataFusion 54 fails these with "Schema mismatch" when both tables carry
    # the same schema metadata key with different values.
    cases = {
        "SELECT a.*, b.reward FROM robots.episodes a CROSS JOIN "
        "(SELECT reward FROM robots.rewards LIMIT 2) b": EPISODES_ROWS * 2,
        "SELECT e.episode_id, r.reward FROM robots.episodes e "
        "JOIN robots.rewards r ON e.episode_id = r.episode_id": EPISODES_ROWS,
    }
    for sql, expected in cases.items():
        planned = planner.plan(sql, DEV_PRINCIPAL)
        assert rows(planner, planned.spec).num_rows == expected


def test_joins_run_when_schema_metadata_conflicts(tmp_path: Path) -> None:
    # One metadata key with a different value per table breaks DataFusion 54's
    # reordered joins; Query keeps the written join order for such tables.
    legacy = LocalCatalog(tmp_path / "legacy", conflicting_metadata=True)
    legacy.create("robots.episodes", episodes(0, 1000))
    legacy.create("robots.rewards", rewards(0, 1000))
    planner = Planner(legacy.resolve, legacy.refs)
    cases = {
        "SELECT a.*, b.reward FROM robots.episodes a CROSS JOIN "
        "(SELECT reward FROM robots.rewards LIMIT 2) b": 2000,
        "SELECT e.robot, r.reward FROM robots.episodes e "
        "JOIN robots.rewards r ON e.episode_id = r.episode_id ORDER BY r.reward": 1000,
        "SELECT * FROM robots.episodes e LEFT JOIN robots.rewards r "
        "ON e.episode_id = r.episode_id": 1000,
    }
    for sql, expected in cases.items():
        planned = planner.plan(sql, DEV_PRINCIPAL)
        assert rows(planner, planned.spec).num_rows == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT FROM robots.episodes", EPISODES_ROWS),
        ("SELECT FROM robots.episodes LIMIT 5", 5),
        ("SELECT FROM robots.episodes WHERE duration_s < 0", 0),
    ],
)
def test_a_zero_column_result_keeps_its_rows(planner: Planner, sql: str, expected: int) -> None:
    """Relabelling a batch of no columns made a batch of no rows: SELECT FROM t lost every
    row (or failed merging them, IndexError sent back as a SqlError)."""
    got = rows(planner, planner.plan(sql, DEV_PRINCIPAL).spec)
    assert (got.num_columns, got.num_rows) == (0, expected)
    assert rows(planner, planner.plan(f"SELECT count(*) AS n FROM ({sql})", DEV_PRINCIPAL).spec)[
        "n"
    ].to_pylist() == [expected]
