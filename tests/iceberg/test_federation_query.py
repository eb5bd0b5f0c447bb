"""Iceberg federation end to end: real ``lake meta`` + ``lake query``, SeaweedFS's catalog, ADBC.

Tables are written by pyiceberg; Query reaches the catalog through a counting
proxy (tools/lake_testing/catalog_proxy.py), so the tests can prove what it
sends upstream: only GET/HEAD (and the OAuth POST), nothing for DDL/DML.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType

import lake_sdk
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tests.telemetry.scrape import scrape, value
from tools.lake_testing.catalog_proxy import CatalogProxy
from tools.lake_testing.data import create_table
from tools.lake_testing.iceberg import EPISODE_ROWS, SeaweedIceberg, federation_env, write_episodes
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query

pytestmark = [pytest.mark.iceberg, pytest.mark.s3, pytest.mark.slow]

ADMIN, ANALYST = "admin-token-" + os.urandom(4).hex(), "analyst-token-" + os.urandom(4).hex()
SITES = TableRef("robots", "sites")
SITES_SCHEMA = pa.schema([pa.field("robot_id", pa.utf8()), pa.field("site", pa.utf8())])
SELECT = "SELECT episode_id, reward FROM iceberg.analytics.episodes WHERE robot_id = 'alpha'"


@dataclass
class Federated:
    server: SeaweedIceberg
    proxy: CatalogProxy
    meta: LakeProcess
    query: LakeProcess
    metrics_port: int

    def adbc(self, token: str = ADMIN) -> Any:
        return flightsql.connect(
            self.query.url,
            db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {token}"},
        )

    def sql(self, sql: str, token: str = ADMIN) -> pa.Table:
        with self.adbc(token) as conn, conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetch_arrow_table()

    def flight(self) -> flight.FlightClient:
        return flight.FlightClient(f"grpc+tcp://{self.query.addr}")

    def table(self, name: str, namespace: str = "analytics") -> Any:
        return self.server.catalog().load_table((namespace, name))


def _principals(path: Path) -> Path:
    bindings = [
        {"token": ADMIN, "principal_id": "admin", "tenant_id": "t1", "role": "admin"},
        {
            "token": ANALYST,
            "principal_id": "analyst",
            "tenant_id": "t1",
            "role": "user",
            "namespaces": ["analytics"],
        },
    ]
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def fed(
    iceberg_server: SeaweedIceberg, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Federated]:
    root = tmp_path_factory.mktemp("federation")
    catalog = iceberg_server.catalog()
    write_episodes(catalog, "analytics")
    write_episodes(catalog, "models")  # allowlisted, not in the analyst's grants
    write_episodes(catalog, "hidden")  # exists upstream, outside the allowlist
    proxy = CatalogProxy(iceberg_server.iceberg_endpoint).start()
    metrics_port = free_port()
    env = {
        "LAKE_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
        **federation_env(iceberg_server, "analytics,models", endpoint=proxy.endpoint),
        "LAKE_AUTH_PRINCIPALS_FILE": str(_principals(root / "principals.json")),
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
    }
    meta = start_meta(root / "data", root)
    try:
        query = start_query(meta.addr, root, env=env, probe_token=ADMIN)
        try:
            create_table(meta.addr, SITES, SITES_SCHEMA)
            with lake_sdk.Client(query.url, token=ADMIN) as client:
                client.append_batches(
                    SITES,
                    [pa.record_batch([["alpha", "beta"], ["lab", "field"]], schema=SITES_SCHEMA)],
                )
            yield Federated(iceberg_server, proxy, meta, query, metrics_port)
        finally:
            query.stop()
    finally:
        meta.stop()
        proxy.stop()


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_startup_checked_each_namespace_without_listing(fed: Federated) -> None:
    assert fed.proxy.requests["HEAD"] >= 2  # analytics and models, point checks
    assert set(fed.proxy.requests) <= {"GET", "HEAD", "token"}


def test_select_returns_pyiceberg_rows(fed: Federated) -> None:
    got = fed.sql(SELECT)
    expected = (
        fed.table("episodes")
        .scan(row_filter="robot_id == 'alpha'", selected_fields=("episode_id", "reward"))
        .to_arrow()
    )
    assert got.num_rows == 20
    assert _sorted(got) == _sorted(expected)
    assert _sorted(got) == _sorted(
        pa.Table.from_pylist(
            [
                {"episode_id": r["episode_id"], "reward": r["reward"]}
                for r in EPISODE_ROWS
                if r["robot_id"] == "alpha"
            ]
        )
    )


def test_join_with_a_native_lake_table(fed: Federated) -> None:
    got = fed.sql(
        "SELECT e.episode_id, s.site FROM iceberg.analytics.episodes e "
        "JOIN lake.robots.sites s ON e.robot_id = s.robot_id WHERE e.reward >= 9"
    )
    expected = [
        {"episode_id": r["episode_id"], "site": {"alpha": "lab", "beta": "field"}[r["robot_id"]]}
        for r in EPISODE_ROWS
        if r["reward"] >= 9 and r["robot_id"] in ("alpha", "beta")
    ]
    assert got.num_rows > 0
    assert _sorted(got) == _sorted(pa.Table.from_pylist(expected))


def test_a_schema_evolved_table_reads_by_field_id(fed: Federated) -> None:
    catalog = fed.server.catalog()
    table = write_episodes(catalog, "analytics", "evolved")
    with table.update_schema() as update:
        update.rename_column("reward", "score")
        update.add_column("site", DoubleType())
    table = catalog.load_table(("analytics", "evolved"))
    table.append(
        pa.Table.from_pylist(
            [{"episode_id": 999, "robot_id": "delta", "score": 4.5, "site": 1.0}],
            schema=table.schema().as_arrow(),
        )
    )
    got = fed.sql("SELECT episode_id, score, site FROM iceberg.analytics.evolved")
    assert got.column_names == ["episode_id", "score", "site"]
    rows = {r["episode_id"]: (r["score"], r["site"]) for r in got.to_pylist()}
    assert len(rows) == len(EPISODE_ROWS) + 1
    for r in EPISODE_ROWS:  # written before the rename: read by field id, not name
        assert rows[r["episode_id"]] == (r["reward"], None)
    assert rows[999] == (4.5, 1.0)
    pruned = fed.sql("SELECT episode_id FROM iceberg.analytics.evolved WHERE score > 9.4")
    assert sorted(pruned.column("episode_id").to_pylist()) == sorted(
        r["episode_id"] for r in EPISODE_ROWS if r["reward"] > 9.4
    )


def _descriptor(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def _options() -> flight.FlightCallOptions:
    return flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {ADMIN}".encode())])


def _redeemed_after_an_append(fed: Federated, name: str, sql: str, times: int) -> list[pa.Table]:
    """Plan ``sql`` over a new table ``name``, append a row upstream, then redeem ``times``."""
    table = write_episodes(fed.server.catalog(), "analytics", name)
    with fed.flight() as client:
        info = client.get_flight_info(_descriptor(sql), _options())
        table.append(
            pa.Table.from_pylist(
                [{"episode_id": 5000, "robot_id": "alpha", "reward": 1.0}],
                schema=table.schema().as_arrow(),
            )
        )
        return [
            client.do_get(info.endpoints[0].ticket, _options()).read_all() for _ in range(times)
        ]


def test_an_append_between_flight_info_and_doget_changes_nothing(fed: Federated) -> None:
    sql = "SELECT count(*) AS n, sum(episode_id) AS s FROM iceberg.analytics.appended"
    [got] = _redeemed_after_an_append(fed, "appended", sql, times=1)
    assert got.to_pylist() == [
        {"n": len(EPISODE_ROWS), "s": sum(r["episode_id"] for r in EPISODE_ROWS)}
    ]


def test_a_plain_scan_reads_its_pinned_snapshot_after_an_append(fed: Federated) -> None:
    """``SELECT *`` is planned once (DoGet reuses the plain projection): still the pinned rows."""
    sql = "SELECT * FROM iceberg.analytics.plain_appended"
    got, again = _redeemed_after_an_append(fed, "plain_appended", sql, times=2)
    assert sorted(got.column("episode_id").to_pylist()) == sorted(
        r["episode_id"] for r in EPISODE_ROWS
    )
    assert again.equals(got)


def test_a_plain_scan_the_plugin_refuses_runs_in_datafusion(fed: Federated) -> None:
    """An identity-partitioned table is not read directly: DoGet falls back, once."""
    base = write_episodes(fed.server.catalog(), "analytics", "plain_partitioned")
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "robot_id"))
    table = fed.server.catalog().create_table(
        ("analytics", "plain_parted"), base.schema(), partition_spec=spec
    )
    table.append(base.scan().to_arrow())
    got = fed.sql("SELECT * FROM iceberg.analytics.plain_parted")
    assert _sorted(got) == _sorted(pa.Table.from_pylist(EPISODE_ROWS))


def test_a_snapshot_expired_before_doget_fails_explicitly(fed: Federated) -> None:
    catalog = fed.server.catalog()
    table = write_episodes(catalog, "analytics", "expiring")
    pinned = table.metadata.current_snapshot_id
    with fed.flight() as client:
        info = client.get_flight_info(
            _descriptor("SELECT * FROM iceberg.analytics.expiring"), _options()
        )
        table.append(
            pa.Table.from_pylist(
                [{"episode_id": 1, "robot_id": "x", "reward": 0.5}],
                schema=table.schema().as_arrow(),
            )
        )
        table = catalog.load_table(("analytics", "expiring"))
        table.maintenance.expire_snapshots().by_id(pinned).commit()
        assert catalog.load_table(("analytics", "expiring")).snapshot_by_id(pinned) is None
        with pytest.raises(pa.ArrowException) as info_error:  # pyarrow: ArrowInvalid
            client.do_get(info.endpoints[0].ticket, _options()).read_all()
    message = str(info_error.value)
    assert "FAILED_PRECONDITION" in message  # VersionReclaimed's status: never fell forward
    assert str(pinned) in message  # the pinned snapshot, not a newer one


def _error(fed: Federated, sql: str, token: str) -> str:
    with pytest.raises(flightsql.Error) as info:
        fed.sql(sql, token)
    return str(info.value)


def test_hidden_and_missing_namespaces_look_the_same(fed: Federated) -> None:
    def shape(message: str, name: str) -> str:
        return message.replace(name, "<name>")

    cases = [
        (ADMIN, "iceberg.hidden.episodes"),  # outside the allowlist (exists upstream)
        (ANALYST, "iceberg.models.episodes"),  # allowlisted, outside the grants
        (ADMIN, "iceberg.nowhere.episodes"),  # no such namespace
        (ADMIN, "iceberg.analytics.missing"),  # no such table
    ]
    shapes = {shape(_error(fed, f"SELECT * FROM {name}", token), name) for token, name in cases}
    assert len(shapes) == 1, shapes
    assert "not found" in shapes.pop()
    # The analyst does read what the grant and the allowlist both allow.
    assert fed.sql(SELECT, ANALYST).num_rows == 20


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE iceberg.analytics.t2 (a INT)",
        "DROP TABLE iceberg.analytics.episodes",
        "ALTER TABLE iceberg.analytics.episodes ADD COLUMN c INT",
        "INSERT INTO iceberg.analytics.episodes VALUES (1, 'a', 1.0)",
        "UPDATE iceberg.analytics.episodes SET reward = 0",
        "DELETE FROM iceberg.analytics.episodes",
        "MERGE INTO iceberg.analytics.episodes t USING iceberg.analytics.episodes s "
        "ON t.episode_id = s.episode_id WHEN MATCHED THEN DELETE",
    ],
)
def test_ddl_and_dml_are_rejected_before_any_upstream_request(fed: Federated, sql: str) -> None:
    before = sum(fed.proxy.requests.values())
    message = _error(fed, sql, ADMIN)
    assert "read-only" in message.lower() or "ReadOnly" in message
    assert sum(fed.proxy.requests.values()) == before


def test_listings_never_show_or_fetch_iceberg_tables(fed: Federated) -> None:
    before = sum(fed.proxy.requests.values())
    with fed.adbc() as conn:
        objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    catalogs = {c["catalog_name"] for c in objects}
    assert "iceberg" not in catalogs
    tables = [
        t["table_name"]
        for c in objects
        for s in c["catalog_db_schemas"] or []
        for t in s["db_schema_tables"] or []
    ]
    assert "sites" in tables
    assert "episodes" not in tables
    assert sum(fed.proxy.requests.values()) == before  # no enumeration upstream


def test_upstream_saw_only_reads(fed: Federated) -> None:
    fed.sql(SELECT)
    assert fed.proxy.requests["GET"] > 0
    assert set(fed.proxy.requests) <= {"GET", "HEAD", "token"}, fed.proxy.requests


def test_federation_counts_into_metrics_without_names(fed: Federated) -> None:
    """Cache and load counters move on Query's /metrics; no namespace or table is a label."""
    series = "lake_query_iceberg_federation_events_total"
    before = value(scrape(fed.metrics_port), series, event="cache_miss")
    fed.sql("SELECT count(*) FROM iceberg.models.episodes")  # a key not loaded before
    fed.sql("SELECT count(*) FROM iceberg.models.episodes")  # fresh for 5 s: a hit
    text = scrape(fed.metrics_port)
    assert value(text, series, event="cache_miss") > before
    assert value(text, series, event="cache_hit") >= 1
    leaked = [n for n in ("analytics", "models", "episodes", "hidden") if n in text]
    assert leaked == [], leaked
