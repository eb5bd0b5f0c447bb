"""Tables through Query alone: create, list, describe and drop on both SDK clients, and
``SHOW TABLES`` / ``information_schema`` through Flight SQL (the SDK and ADBC), against
a real ``lake meta`` and ``lake query``. Tenant isolation of the same calls is in
``tests/security/test_table_chores.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pytest

import lake_sdk
from lake_core.filetype import file_field
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.servers import start_meta

RUNS = pa.schema([("run_id", pa.int64()), ("robot", pa.utf8()), file_field("video")])
SITES = pa.schema([("site", pa.utf8())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeCluster]:
    """One Metasrv and Query for the module; each test works in its own namespaces."""
    root = tmp_path_factory.mktemp("chores")
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        "LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects"),
    }
    lake = LakeCluster(root=root, meta=start_meta(root / "data", root, env=env), env=env)
    try:
        lake.add_query()
        yield lake
    finally:
        lake.stop()


def names(tables: list[lake_sdk.TableInfo], *namespaces: str) -> list[str]:
    return [t.name for t in tables if t.table.namespace in namespaces]


def test_blocking_client_creates_lists_describes_and_drops(cluster: LakeCluster) -> None:
    with lake_sdk.Client(cluster.query.url) as client:
        created = client.create_table("fleet.runs", RUNS)
        assert (created.name, created.version, created.schema) == ("fleet.runs", 0, RUNS)
        client.create_table("fleet.sites", SITES)
        assert names(client.list_tables(), "fleet") == ["fleet.runs", "fleet.sites"]
        # Appends go through Query and see the new table at once.
        client.append_batches("fleet.sites", pa.table({"site": ["lab", "field"]}, schema=SITES))
        described = client.describe_table("fleet.sites")
        assert (described.version, described.schema) == (1, SITES)
        assert client.drop_table("fleet.sites") == 1
        assert names(client.list_tables(), "fleet") == ["fleet.runs"]
        with pytest.raises(lake_sdk.TableNotFound):
            client.describe_table("fleet.sites")


def test_bad_input_is_a_typed_error(cluster: LakeCluster) -> None:
    with lake_sdk.Client(cluster.query.url) as client:
        client.create_table("bad.runs", RUNS)
        with pytest.raises(lake_sdk.TableExists):
            client.create_table("bad.runs", SITES)
        with pytest.raises(lake_sdk.InvalidSchema):
            client.create_table("bad.empty", pa.schema([]))
        with pytest.raises(lake_sdk.InvalidArgument):
            client.create_table("bad.notaschema", {"a": "int64"})  # type: ignore[arg-type]
        with pytest.raises(lake_sdk.InvalidName):
            client.create_table("no-namespace", SITES)
        with pytest.raises(lake_sdk.TableNotFound):
            client.drop_table("bad.missing")
        with pytest.raises(lake_sdk.TableNotFound):
            client.describe_table("bad.missing")
        # Nothing half-made: the failed creates left no table behind.
        assert names(client.list_tables(), "bad") == ["bad.runs"]
        assert client.describe_table("bad.runs").schema == RUNS


def test_async_client_has_the_same_methods(cluster: LakeCluster) -> None:
    async def chores() -> None:
        async with lake_sdk.AsyncClient(cluster.query.url) as client:
            created = await client.create_table("asyncns.sites", SITES)
            assert created.schema == SITES
            assert names(await client.list_tables(), "asyncns") == ["asyncns.sites"]
            assert (await client.describe_table("asyncns.sites")).version == 0
            with pytest.raises(lake_sdk.TableExists):
                await client.create_table("asyncns.sites", SITES)
            assert await client.drop_table("asyncns.sites") == 0
            assert names(await client.list_tables(), "asyncns") == []

    asyncio.run(chores())


def test_show_tables_and_information_schema_through_flight_sql(cluster: LakeCluster) -> None:
    with lake_sdk.Client(cluster.query.url) as client:
        client.create_table("shown.runs", RUNS)
        client.create_table("shown.sites", SITES)
        client.append_batches("shown.sites", pa.table({"site": ["lab"]}, schema=SITES))
        shown = client.query_table("SHOW TABLES").to_pylist()
        lake_tables = {
            (r["table_schema"], r["table_name"], r["table_type"])
            for r in shown
            if r["table_schema"] == "shown"
        }
        assert lake_tables == {("shown", "runs", "BASE TABLE"), ("shown", "sites", "BASE TABLE")}
        columns = client.query_table(
            "SELECT table_schema, table_name, column_name, data_type "
            "FROM information_schema.columns WHERE table_schema = 'shown' "
            "ORDER BY table_name, ordinal_position"
        ).to_pylist()
        assert [(c["table_name"], c["column_name"]) for c in columns] == [
            ("runs", "run_id"),
            ("runs", "robot"),
            ("runs", "video"),
            ("sites", "site"),
        ]
        assert client.query_table("SHOW COLUMNS FROM shown.sites").column(
            "column_name"
        ).to_pylist() == ["site"]
        only = client.query_table(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'shown' ORDER BY table_name"
        )
        assert only.column("table_name").to_pylist() == ["runs", "sites"]
        # Reads are unchanged beside a listing.
        assert client.query_table("SELECT site FROM shown.sites").to_pylist() == [{"site": "lab"}]


def test_the_listing_of_one_table_is_not_a_scan_of_it(lake_cluster: LakeCluster) -> None:
    # With one table pinned, a plain projection of a listing looks like a scan of it.
    with lake_sdk.Client(lake_cluster.query.url) as client:
        client.create_table("one.sites", SITES)
        client.append_batches("one.sites", pa.table({"site": ["lab"]}, schema=SITES))
        listed = client.query_table(
            "SELECT table_schema, table_name FROM information_schema.tables"
        )
        assert ("one", "sites") in {
            (r["table_schema"], r["table_name"]) for r in listed.to_pylist()
        }
        assert client.query_table("SHOW TABLES").num_rows == listed.num_rows


def test_adbc_metadata_calls_and_show_tables(cluster: LakeCluster) -> None:
    with lake_sdk.Client(cluster.query.url) as client:
        client.create_table("adbc.sites", SITES)
    with flightsql.connect(cluster.query.url) as conn:
        objects = conn.adbc_get_objects(depth="tables", db_schema_filter="adbc").read_all()
        listed = [
            (s["db_schema_name"], t["table_name"])
            for catalog in objects.to_pylist()
            for s in catalog["catalog_db_schemas"]
            for t in s["db_schema_tables"]
        ]
        assert listed == [("adbc", "sites")]
        assert conn.adbc_get_table_schema("sites", db_schema_filter="adbc") == SITES
        with conn.cursor() as cursor:
            cursor.execute("SHOW TABLES")
            rows = cursor.fetch_arrow_table().to_pylist()
        assert ("adbc", "sites") in {(r["table_schema"], r["table_name"]) for r in rows}
