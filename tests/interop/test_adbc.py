"""The ADBC Flight SQL driver against a real ``lake query`` process."""

from __future__ import annotations

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lake_sdk
from lake_core.config import QUERY_DATA_ADDR
from tools.lake_testing.data import (
    EPISODES,
    EPISODES_SCHEMA,
    ROBOTS,
    ROBOTS_SCHEMA,
    create_table,
    episodes,
    robots,
)
from tools.lake_testing.dataplane import data_plane_streams
from tools.lake_testing.plugin import LakeCluster

JOIN_SQL = """
WITH good AS (
    SELECT episode_id, robot_id, reward FROM robots.episodes
    WHERE reward > (SELECT avg(reward) FROM lake.robots.episodes)
)
SELECT g.episode_id, g.reward, f.site, f.serial
FROM good g JOIN lake.robots.fleet f ON g.robot_id = f.robot_id
WHERE f.robot_id IN (SELECT robot_id FROM robots.fleet WHERE site <> 'field')
ORDER BY g.episode_id
"""


def _load(lake_cluster: LakeCluster) -> LakeCluster:
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    create_table(lake_cluster.meta.addr, ROBOTS, ROBOTS_SCHEMA)
    with lake_sdk.connect(lake_cluster.query.url) as client:
        assert client.append_batches(EPISODES, [episodes(0, 10_000)]) == 1
        assert client.append_batches(EPISODES, [episodes(10_000, 10_000)]) == 2
        assert client.append_batches(ROBOTS, [robots()]) == 1
    return lake_cluster


@pytest.fixture
def loaded(lake_cluster: LakeCluster) -> LakeCluster:
    return _load(lake_cluster)


@pytest.fixture
def loaded_paths(doget_cluster: LakeCluster) -> LakeCluster:
    """``loaded``, once per DoGet path (ADBC follows the data plane's endpoint location)."""
    return _load(doget_cluster)


def _expected_join() -> pa.Table:
    eps = pa.Table.from_batches([episodes(0, 20_000)])
    fleet = pa.Table.from_batches([robots()])
    good = eps.filter(pc.greater(eps["reward"], pc.mean(eps["reward"])))
    keep = fleet.filter(pc.not_equal(fleet["site"], "field"))
    joined = good.join(keep, "robot_id", join_type="inner").sort_by("episode_id")
    return joined.select(["episode_id", "reward", "site", "serial"])


def test_join_subquery_cte_through_adbc(loaded: LakeCluster) -> None:
    with flightsql.connect(loaded.query.url) as conn, conn.cursor() as cur:
        cur.execute(JOIN_SQL)
        got = cur.fetch_arrow_table()
    expected = _expected_join()
    assert got.num_rows == expected.num_rows > 0
    assert got.column_names == expected.column_names
    for name in expected.column_names:
        assert got[name].combine_chunks().equals(expected[name].combine_chunks()), name


def test_fetches_20000_rows_in_several_batches_with_exact_types(
    loaded_paths: LakeCluster,
) -> None:
    before = data_plane_streams(loaded_paths.query)
    with flightsql.connect(loaded_paths.query.url) as conn, conn.cursor() as cur:
        cur.execute("SELECT * FROM lake.robots.episodes ORDER BY steps")
        reader = cur.fetch_record_batch()
        batches = list(reader)
    assert len(batches) > 1
    table = pa.Table.from_batches(batches)
    assert table.num_rows == 20_000
    for want, got in zip(EPISODES_SCHEMA, table.schema, strict=True):
        assert (got.name, got.type) == (want.name, want.type)
    expected = pa.Table.from_batches([episodes(0, 20_000)])
    assert table.select(EPISODES_SCHEMA.names).cast(EPISODES_SCHEMA).equals(expected)
    on_data_plane = QUERY_DATA_ADDR in loaded_paths.query.env
    # ADBC's own GetSqlInfo at connect is a data-plane stream too.
    assert (data_plane_streams(loaded_paths.query) > before) == on_data_plane


def test_get_objects_lists_tables_with_real_schemas(loaded: LakeCluster) -> None:
    # (Through the data plane: tests/security/test_tls_auth.py lists objects over TLS.)
    with flightsql.connect(loaded.query.url) as conn:
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
        schema = conn.adbc_get_table_schema(
            "episodes", catalog_filter="lake", db_schema_filter="robots"
        )
    catalogs = {c["catalog_name"]: c for c in objects}
    assert "lake" in catalogs
    schemas = {s["db_schema_name"]: s for s in catalogs["lake"]["catalog_db_schemas"]}
    tables = {t["table_name"]: t for t in schemas["robots"]["db_schema_tables"]}
    assert set(tables) == {"episodes", "fleet"}
    columns = [c["column_name"] for c in tables["fleet"]["table_columns"]]
    assert columns == ROBOTS_SCHEMA.names
    assert [(f.name, f.type) for f in schema] == [(f.name, f.type) for f in EPISODES_SCHEMA]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM robots.episodes",
        "INSERT INTO robots.fleet VALUES ('x', 'y', 1.0, 1, NULL)",
        "DROP TABLE robots.fleet",
        "CREATE TABLE robots.t AS SELECT 1",
    ],
)
def test_dml_through_adbc_gets_the_read_only_error(loaded: LakeCluster, sql: str) -> None:
    with flightsql.connect(loaded.query.url) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.ProgrammingError, match="Lake SQL is read-only"):
            cur.execute(sql)
        cur.execute("SELECT count(*) AS n FROM robots.fleet")
        assert cur.fetchone() == (5,)


def test_execute_update_gets_the_read_only_error(loaded: LakeCluster) -> None:
    with flightsql.connect(loaded.query.url) as conn, conn.cursor() as cur:
        cur.adbc_statement.set_sql_query("DELETE FROM robots.fleet")
        with pytest.raises(adbc_driver_manager.Error, match="Lake SQL is read-only"):
            cur.adbc_statement.execute_update()
