"""Bulk ingest (Flight SQL CommandStatementIngest) from ADBC, polars and pandas, on real processes.

One Metasrv and one Query replica (``lake_cluster``): each ingest is one
stream, one atomic append, one table version; a refused or interrupted one
leaves no version and no rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
import pytest

from lake_core.filetype import file_field
from lake_core.names import TableRef
from lake_objects.settings import StageSettings
from tools.lake_testing.data import create_table, describe_version
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.servers import start_meta, start_query

T = TableRef("fleet", "samples")
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.float64())])


def rows(start: int, count: int) -> pa.Table:
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table({"id": ids, "value": pa.array(range(start, start + count), pa.float64())})


def count(url: str, table: TableRef = T) -> int:
    with flightsql.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table.namespace}.{table.name}")
        value = cur.fetchone()
    assert value is not None
    return int(value[0])


def ingest(url: str, data: Any, mode: str = "append", table: TableRef = T) -> int:
    with flightsql.connect(url) as conn, conn.cursor() as cur:
        return int(cur.adbc_ingest(table.name, data, mode=mode, db_schema_name=table.namespace))


def test_a_million_rows_are_one_version(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    data = rows(0, 1_000_000)
    reader = pa.RecordBatchReader.from_batches(SCHEMA, data.to_batches(max_chunksize=65_536))
    assert ingest(lake_cluster.query.url, reader) == 1_000_000
    assert describe_version(lake_cluster.meta.addr, T) == 1
    assert count(lake_cluster.query.url) == 1_000_000
    with flightsql.connect(lake_cluster.query.url) as conn, conn.cursor() as cur:
        cur.execute('SELECT version FROM fleet."samples$versions" ORDER BY version')
        assert [v for (v,) in cur.fetchall()] == [0, 1]
        cur.execute("SELECT sum(id) FROM fleet.samples")
        assert cur.fetchone() == (sum(range(1_000_000)),)


def test_wrong_schema_makes_no_version(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    wrong = pa.table({"id": pa.array([1, 2], pa.int32()), "value": pa.array([1.0, 2.0])})
    with pytest.raises(adbc_driver_manager.ProgrammingError) as caught:
        ingest(lake_cluster.query.url, wrong)
    assert "SchemaMismatch" in str(caught.value) or "does not match" in str(caught.value)
    missing = TableRef("fleet", "missing")
    with pytest.raises(adbc_driver_manager.Error) as absent:
        ingest(lake_cluster.query.url, rows(0, 3), table=missing)
    assert "fleet.missing" in str(absent.value)
    assert describe_version(lake_cluster.meta.addr, T) == 0
    assert count(lake_cluster.query.url) == 0


def test_over_limit_ingests_make_no_version(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    lake_cluster.meta = lake_cluster.replace_meta(
        {"LAKE_INGEST_MAX_ROWS": "5000", "LAKE_INGEST_MAX_BYTES": str(1024 * 1024)}
    )
    url = lake_cluster.query.url
    with pytest.raises(adbc_driver_manager.Error) as too_many:
        ingest(url, rows(0, 5001))
    assert "LAKE_INGEST_MAX_ROWS" in str(too_many.value)
    # 4,000 rows of 16 bytes fit the rows limit, not 1 MiB... 70,000 would not: bytes first.
    big = pa.table({"id": pa.array(range(4000), pa.int64()), "value": pa.array([0.5] * 4000)})
    wide = pa.concat_tables([big] * 1)
    assert ingest(url, wide) == 4000  # 64 KB: within both limits
    assert describe_version(lake_cluster.meta.addr, T) == 1
    lake_cluster.meta = lake_cluster.replace_meta(
        {"LAKE_INGEST_MAX_ROWS": "10000000", "LAKE_INGEST_MAX_BYTES": str(1024 * 1024)}
    )
    url = lake_cluster.query.url
    with pytest.raises(adbc_driver_manager.Error) as too_big:
        ingest(url, rows(0, 200_000))  # 3.2 MB
    assert "LAKE_INGEST_MAX_BYTES" in str(too_big.value)
    assert describe_version(lake_cluster.meta.addr, T) == 1
    assert count(url) == 4000


def test_create_create_append_and_replace(lake_cluster: LakeCluster) -> None:
    url = lake_cluster.query.url
    assert ingest(url, rows(0, 10), mode="create") == 10
    assert describe_version(lake_cluster.meta.addr, T) == 1
    with pytest.raises(adbc_driver_manager.Error) as exists:
        ingest(url, rows(10, 10), mode="create")
    assert "TableExists" in str(exists.value) or "exists" in str(exists.value)
    assert ingest(url, rows(10, 10), mode="create_append") == 10
    other = TableRef("fleet", "other")
    assert ingest(url, rows(0, 5), mode="create_append", table=other) == 5
    with pytest.raises(adbc_driver_manager.NotSupportedError) as replace:
        ingest(url, rows(0, 5), mode="replace")
    assert "append-only" in str(replace.value)
    assert describe_version(lake_cluster.meta.addr, T) == 2
    assert count(url) == 20
    assert count(url, other) == 5


def test_polars_and_pandas_append_over_adbc(lake_cluster: LakeCluster) -> None:
    import pandas as pd
    import polars as pl

    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    frame = pl.DataFrame({"id": list(range(100)), "value": [float(i) for i in range(100)]})
    with flightsql.connect(url) as conn:
        written = frame.write_database(
            "fleet.samples", conn, if_table_exists="append", engine="adbc"
        )
    assert written == 100
    pandas_frame = pd.DataFrame({"id": range(100, 150), "value": [0.25] * 50})
    with flightsql.connect(url) as conn:
        assert (
            pandas_frame.to_sql("samples", conn, schema="fleet", if_exists="append", index=False)
            == 50
        )
    assert describe_version(lake_cluster.meta.addr, T) == 2
    assert count(url) == 150


class SlowReader:
    """Batches produced one at a time; ``sent`` is set once ``after`` have gone out."""

    def __init__(self, batches: int, after: int) -> None:
        self.batches = batches
        self.after = after
        self.sent = threading.Event()
        self.release = threading.Event()

    def reader(self) -> pa.RecordBatchReader:
        def produce() -> Iterator[pa.RecordBatch]:
            for index in range(self.batches):
                if index == self.after:
                    self.sent.set()
                    self.release.wait(60)
                yield rows(index * 10_000, 10_000).to_batches()[0]

        return pa.RecordBatchReader.from_batches(SCHEMA, produce())


@pytest.mark.parametrize("victim", ["query", "meta"])
def test_sigkill_mid_stream_leaves_nothing_or_everything(
    lake_cluster: LakeCluster, victim: str
) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    slow = SlowReader(batches=20, after=10)
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(ingest(lake_cluster.query.url, slow.reader()))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert slow.sent.wait(60)  # 100,000 rows already streamed through Query to Metasrv
    process = lake_cluster.query if victim == "query" else lake_cluster.meta
    process.kill()
    slow.release.set()
    thread.join(60)
    assert not thread.is_alive()
    assert isinstance(outcome[0], adbc_driver_manager.Error)
    process.start()
    if victim == "meta":
        lake_cluster.query.restart()  # not stuck in gRPC's reconnect backoff
    seen = count(lake_cluster.query.url)
    version = describe_version(lake_cluster.meta.addr, T)
    assert (seen, version) in ((0, 0), (200_000, 1))
    # Nothing lost afterwards: the next ingest commits exactly one more version.
    assert ingest(lake_cluster.query.url, rows(0, 1000)) == 1000
    assert describe_version(lake_cluster.meta.addr, T) == version + 1
    assert count(lake_cluster.query.url) == seen + 1000


CLIENT = """
import sys, time
import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
schema = pa.schema([pa.field("id", pa.int64()), pa.field("value", pa.float64())])
def produce():
    for i in range(1000):
        if i == 10:
            print("sent", flush=True)
            time.sleep(3600)
        ids = pa.array(range(i * 10_000, (i + 1) * 10_000), pa.int64())
        yield pa.record_batch([ids, ids.cast(pa.float64())], schema=schema)
with flightsql.connect(sys.argv[1], autocommit=True) as conn, conn.cursor() as cur:
    cur.adbc_ingest("samples", pa.RecordBatchReader.from_batches(schema, produce()),
                    mode="append", db_schema_name="fleet")
"""


def test_a_client_killed_mid_stream_commits_nothing(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    child = subprocess.Popen([sys.executable, "-c", CLIENT, url], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "sent"  # 100,000 rows on their way
    finally:
        child.kill()
        child.wait(30)
    # The next ingest is version 1 and the only rows, now and after Query and
    # Metasrv had every chance to notice the broken stream.
    assert ingest(url, rows(0, 1000)) == 1000
    assert describe_version(lake_cluster.meta.addr, T) == 1
    assert ingest(url, rows(1000, 1000)) == 1000
    assert describe_version(lake_cluster.meta.addr, T) == 2
    assert count(url) == 2000


TOKENS = {"acme": "lk_acme_ingest_0001"}


def _principals(path: Path) -> Path:
    bindings = [
        {
            "token": TOKENS["acme"],
            "principal_id": "ann",
            "tenant_id": "acme",
            "role": "user",
            "namespaces": ["fleet"],
        },
    ]
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(0o600)
    return path


def test_a_tenant_cannot_ingest_file_values_outside_its_prefix(tmp_path: Path) -> None:
    root = tmp_path / "data" / "objects"
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(tmp_path / "keys.json")),
        "LAKE_MANAGED_OBJECT_ROOT": str(root),
    }
    meta = start_meta(tmp_path / "data", tmp_path, env=env)
    query = None
    try:
        query_env = {**env, "LAKE_AUTH_PRINCIPALS_FILE": str(_principals(tmp_path / "p.json"))}
        query = start_query(meta.addr, tmp_path, env=query_env, probe_token=TOKENS["acme"])
        videos = TableRef("fleet", "videos")
        schema = pa.schema([pa.field("id", pa.int64()), file_field("clip")])
        create_table(meta.addr, videos, schema)
        stage = StageSettings.local(root)

        def clip(tenant: str) -> dict[str, object]:
            return {
                "uri": f"{stage.scope(tenant).stage_uri}/clips/a.mp4",
                "size_bytes": 3,
                "sha256": "0" * 64,
                "media_type": "video/mp4",
            }

        def data(tenant: str) -> pa.Table:
            return pa.Table.from_pylist([{"id": 1, "clip": clip(tenant)}], schema=schema)

        def as_acme(table: pa.Table, mode: str = "append", name: str = "videos") -> int:
            header = {"adbc.flight.sql.authorization_header": f"Bearer {TOKENS['acme']}"}
            with flightsql.connect(query.url, db_kwargs=header) as conn, conn.cursor() as cur:
                return int(cur.adbc_ingest(name, table, mode=mode, db_schema_name="fleet"))

        with pytest.raises(adbc_driver_manager.ProgrammingError) as outside:
            as_acme(data("globex"))
        assert "outside this tenant's managed stage" in str(outside.value)
        assert describe_version(meta.addr, videos) == 0
        assert as_acme(data("acme")) == 1
        assert describe_version(meta.addr, videos) == 1
        # A user may append, not create tables.
        with pytest.raises(adbc_driver_manager.ProgrammingError) as create:
            as_acme(rows(0, 1), mode="create", name="fresh")
        assert "admin principal" in str(create.value)
    finally:
        if query is not None:
            query.stop()
        meta.stop()


def test_sdk_ingest_takes_tables_readers_and_frames(lake_cluster: LakeCluster) -> None:
    import asyncio

    import pandas as pd
    import polars as pl

    import lake_sdk

    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    with lake_sdk.connect(url) as client:
        with pytest.raises(lake_sdk.InvalidAppend):
            client.append_batches(T, rows(0, 10_001))  # the spec's 10,000-row contract
        assert client.ingest(T, rows(0, 50_000)) == 1
        reader = pa.RecordBatchReader.from_batches(SCHEMA, rows(50_000, 30_000).to_batches(7_000))
        assert client.ingest("fleet.samples", reader) == 2
        frame = pd.DataFrame({"id": range(80_000, 80_100), "value": [1.5] * 100})
        assert client.ingest(T, frame) == 3
        with pytest.raises(lake_sdk.SchemaMismatch):
            client.ingest(T, pa.table({"id": pa.array([1], pa.int32())}))
        with pytest.raises(lake_sdk.InvalidArgument):
            client.ingest(T, [1, 2, 3])

    async def polars_async() -> int:
        async with lake_sdk.AsyncClient(url) as client:
            frame = pl.DataFrame({"id": list(range(90_000, 90_010)), "value": [2.0] * 10})
            return await client.ingest(T, frame)

    assert asyncio.run(polars_async()) == 4
    assert describe_version(lake_cluster.meta.addr, T) == 4
    assert count(url) == 80_110
    # polars hands out large_string columns: the SDK sends them as the table's string.
    named = TableRef("fleet", "named")
    create_table(lake_cluster.meta.addr, named, pa.schema([pa.field("name", pa.utf8())]))
    with lake_sdk.connect(url) as client:
        assert client.ingest(named, pl.DataFrame({"name": ["a", "b", "c"]})) == 1
    assert count(url, named) == 3
