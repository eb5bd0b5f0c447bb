"""Real ``lake meta`` and ``lake query`` processes, real clients.

Tables are created on Metasrv (the administrative path) and filled through
Query's append DoPut, the way the SDK does it. Every process is started and
stopped by pid by ``tools.lake_testing``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as adbc
import adbc_driver_manager
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.config import QUERY_DATA_ADDR
from lake_core.errors import READ_ONLY_MESSAGE, VersionReclaimed
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_sdk._errors import TrailerCapture, calling, lake_error
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import free_port, start_meta, start_query

pytestmark = pytest.mark.slow

EPISODES = pa.schema(
    [
        ("episode_id", pa.int64()),
        ("robot", pa.utf8()),
        ("duration_s", pa.float64()),
        ("ok", pa.bool_()),
        ("notes", pa.utf8()),
    ]
)
REWARDS = pa.schema([("episode_id", pa.int64()), ("reward", pa.float32())])
ROWS = 20_000
JOINED = """
    WITH good AS (SELECT episode_id, reward FROM robots.rewards WHERE reward >= 0)
    SELECT e.episode_id, e.robot, e.duration_s, e.ok, e.notes, g.reward
    FROM robots.episodes e
    JOIN good g ON e.episode_id = g.episode_id
    JOIN lake.robots.rewards r ON r.episode_id = e.episode_id
    WHERE e.episode_id IN (SELECT episode_id FROM robots.rewards WHERE reward < 1000)
    ORDER BY e.episode_id
"""
JOINED_SCHEMA = pa.schema([*EPISODES, pa.field("reward", pa.float32())])


def episodes_batch(start: int, rows: int) -> pa.RecordBatch:
    ids = range(start, start + rows)
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"robot-{i % 7}" for i in ids]),
            pa.array([i * 0.5 for i in ids], pa.float64()),
            pa.array([i % 2 == 0 for i in ids]),
            # ~300 bytes a row, so 20,000 rows span several 1-4 MB batches.
            pa.array([f"episode {i}: " + "x" * 280 for i in ids]),
        ],
        schema=EPISODES,
    )


def rewards_batch(start: int, rows: int) -> pa.RecordBatch:
    ids = range(start, start + rows)
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([float(i % 100) for i in ids], pa.float32())],
        schema=REWARDS,
    )


async def _append(query_url: str, table: str, batch: pa.RecordBatch) -> protocol.AppendResult:
    # MetaClient speaks the append DoPut; pointed at Query, it is what the SDK sends.
    async with MetaClient(query_url) as client:
        command = protocol.AppendCommand(
            table=TableRef.parse(table), operation_id=new_operation_id()
        )
        return await client.append(command, batch.schema, [batch])


def append(query_url: str, table: str, batch: pa.RecordBatch) -> protocol.AppendResult:
    return asyncio.run(_append(query_url, table, batch))


def load_tables(meta_url: str, query_url: str) -> None:
    async def create() -> None:
        async with MetaClient(meta_url) as meta:
            await meta.create_table(TableRef("robots", "episodes"), EPISODES)
            await meta.create_table(TableRef("robots", "rewards"), REWARDS)

    asyncio.run(create())
    for start in range(0, ROWS, 10_000):
        append(query_url, "robots.episodes", episodes_batch(start, 10_000))
        append(query_url, "robots.rewards", rewards_batch(start, 10_000))


@pytest.fixture
def cluster(lake_cluster: LakeCluster) -> LakeCluster:
    load_tables(f"http://{lake_cluster.meta.addr}", lake_cluster.query.url)
    return lake_cluster


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def test_adbc_dbapi_against_lake_query(cluster: LakeCluster, tmp_path: Path) -> None:
    assert "lake query listening on" in cluster.query.log()
    with adbc.connect(cluster.query.url, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute(JOINED)
            batches = list(cur.fetch_record_batch())
        table = pa.Table.from_batches(batches)
        assert table.schema == JOINED_SCHEMA
        assert table.num_rows == ROWS
        assert len(batches) >= 2
        assert table.column("episode_id").to_pylist() == list(range(ROWS))
        assert table.slice(12_345, 1).to_pylist()[0] == {
            "episode_id": 12_345,
            "robot": "robot-4",
            "duration_s": 6172.5,
            "ok": False,
            "notes": "episode 12345: " + "x" * 280,
            "reward": 45.0,
        }

        objects = conn.adbc_get_objects().read_all().to_pylist()
        (lake,) = objects
        assert lake["catalog_name"] == "lake"
        (robots,) = lake["catalog_db_schemas"]
        tables = {t["table_name"]: t for t in robots["db_schema_tables"]}
        assert sorted(tables) == ["episodes", "rewards"]
        assert [c["column_name"] for c in tables["episodes"]["table_columns"]] == EPISODES.names
        assert conn.adbc_get_table_schema("episodes", db_schema_filter="robots") == EPISODES

        target = tmp_path / "copied.csv"
        for sql in (
            "INSERT INTO robots.episodes VALUES (1, 'r', 1.0, true, 'n')",
            f"COPY (SELECT * FROM robots.episodes) TO '{target}'",
        ):
            with conn.cursor() as cur, pytest.raises(adbc_driver_manager.ProgrammingError) as err:
                cur.execute(sql)
            assert READ_ONLY_MESSAGE in str(err.value)
        assert not target.exists()

        with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as missing:
            cur.execute("SELECT * FROM robots.nope")
        assert "lake.robots.nope" in str(missing.value)


def test_pyarrow_flight_client_against_lake_query(cluster: LakeCluster) -> None:
    with flight.connect(cluster.query.url) as client:
        info = client.get_flight_info(statement(JOINED))
        assert info.schema == JOINED_SCHEMA
        reader = client.do_get(info.endpoints[0].ticket)
        batches = [chunk.data for chunk in reader]
    table = pa.Table.from_batches(batches)
    assert table.num_rows == ROWS
    assert len(batches) >= 2
    assert table.schema == JOINED_SCHEMA


def test_ticket_from_one_replica_served_by_another_across_an_append(
    cluster: LakeCluster,
) -> None:
    second = cluster.add_query()
    with flight.connect(cluster.query.url) as first_client:
        info = first_client.get_flight_info(statement("SELECT * FROM robots.rewards"))
    result = append(second.url, "robots.rewards", rewards_batch(ROWS, 500))
    assert result.version == 3
    with flight.connect(second.url) as second_client:
        pinned = second_client.do_get(info.endpoints[0].ticket).read_all()
        assert pinned.num_rows == ROWS
        assert pinned.schema == info.schema
        # The replica that took the append reads it at once.
        fresh = second_client.get_flight_info(statement("SELECT count(*) AS n FROM robots.rewards"))
        counted = second_client.do_get(fresh.endpoints[0].ticket).read_all()
        assert counted.column("n").to_pylist() == [ROWS + 500]


def _short_retention(tmp_path: Path, data_plane: bool) -> Iterator[LakeCluster]:
    # The count window alone (no age floor): a replaced version goes at once.
    env = {"LAKE_LANCE_RETAIN_VERSIONS": "1", "LAKE_LANCE_RETAIN_MIN_AGE_SECS": "0"}
    if data_plane:
        env[QUERY_DATA_ADDR] = f"127.0.0.1:{free_port()}"
    meta = start_meta(tmp_path / "data", tmp_path, env=env)
    cluster = LakeCluster(root=tmp_path, meta=meta, env=env)
    try:
        cluster.add_query()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def short_retention(tmp_path: Path) -> Iterator[LakeCluster]:
    """Versions reclaimed at once."""
    yield from _short_retention(tmp_path, data_plane=False)


@pytest.fixture(params=["grpcio", "dataplane"])
def short_retention_paths(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LakeCluster]:
    """Versions reclaimed at once; Query serves DoGet on grpcio or on its native data plane."""
    yield from _short_retention(tmp_path, data_plane=request.param == "dataplane")


def test_reclaimed_version_fails_explicitly(short_retention_paths: LakeCluster) -> None:
    cluster = short_retention_paths

    async def create() -> None:
        async with MetaClient(f"http://{cluster.meta.addr}") as meta:
            await meta.create_table(TableRef("robots", "rewards"), REWARDS)

    asyncio.run(create())
    append(cluster.query.url, "robots.rewards", rewards_batch(0, 100))
    with flight.connect(cluster.query.url) as client:
        info = client.get_flight_info(statement("SELECT * FROM robots.rewards"))
        append(cluster.query.url, "robots.rewards", rewards_batch(100, 100))
        append(cluster.query.url, "robots.rewards", rewards_batch(200, 100))
        endpoint = info.endpoints[0]
        if not endpoint.locations:
            # pyarrow raises FAILED_PRECONDITION as ArrowInvalid.
            with pytest.raises(pa.ArrowInvalid) as caught:
                client.do_get(endpoint.ticket).read_all()
    if endpoint.locations:
        # The data plane: pyarrow's server cannot send FAILED_PRECONDITION (UNKNOWN
        # instead), and Lake's clients rebuild the exact class from the trailers.
        capture = TrailerCapture()
        with (
            flight.FlightClient(endpoint.locations[0], middleware=[capture]) as data,
            calling() as trailers,
            pytest.raises(flight.FlightServerError) as caught,
        ):
            data.do_get(endpoint.ticket).read_all()
        assert isinstance(lake_error(caught.value, trailers), VersionReclaimed)
    assert "no longer available" in str(caught.value)
    assert "lake.robots.rewards" in str(caught.value)


def test_failed_precondition_status_for_reclaimed_version(short_retention: LakeCluster) -> None:
    cluster = short_retention

    async def scenario() -> grpc.StatusCode:
        async with MetaClient(f"http://{cluster.meta.addr}") as meta:
            await meta.create_table(TableRef("robots", "rewards"), REWARDS)
        await _append(cluster.query.url, "robots.rewards", rewards_batch(0, 10))
        wrapper = any_pb2.Any()
        wrapper.Pack(sql_pb.CommandStatementQuery(query="SELECT * FROM robots.rewards"))
        from lake_core.proto import flight_grpc
        from lake_core.proto import flight_pb2 as pb

        async with grpc.aio.insecure_channel(cluster.query.addr) as channel:
            stub: Any = flight_grpc.FlightServiceStub(channel)
            info = await stub.GetFlightInfo(
                pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=wrapper.SerializeToString())
            )
            await _append(cluster.query.url, "robots.rewards", rewards_batch(10, 10))
            await _append(cluster.query.url, "robots.rewards", rewards_batch(20, 10))
            try:
                async for _ in stub.DoGet(info.endpoint[0].ticket):
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    assert asyncio.run(scenario()) == grpc.StatusCode.FAILED_PRECONDITION


def test_query_rejects_bad_configuration_before_binding(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "LAKE_QUERY_TICKET_TTL_SECS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "lake_query", "--addr", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert "LAKE_QUERY_TICKET_TTL_SECS" in done.stderr


def test_lake_query_process_serves_on_start_query(tmp_path: Path) -> None:
    meta = start_meta(tmp_path / "data", tmp_path)
    try:
        query = start_query(meta.addr, tmp_path)
        try:
            with flight.connect(query.url) as client:
                info = client.get_flight_info(statement("SELECT 1 AS one"))
                assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [
                    {"one": 1}
                ]
        finally:
            assert query.stop() == 0
    finally:
        meta.stop()


class CountingMeta:
    """A real MetaClient that counts the snapshot RPCs it sends."""

    def __init__(self, client: MetaClient) -> None:
        self.client = client
        self.calls = 0

    async def catalog_snapshot(self, generation: str | None) -> protocol.CatalogSnapshotResult:
        self.calls += 1
        return await self.client.catalog_snapshot(generation)


def test_warm_catalog_makes_zero_rpcs_to_a_real_metasrv(tmp_path: Path) -> None:
    from lake_query.planning.catalog_cache import CatalogCache

    meta = start_meta(tmp_path / "data", tmp_path)
    try:

        async def scenario() -> None:
            async with MetaClient(f"http://{meta.addr}") as client:
                await client.create_table(TableRef("robots", "rewards"), REWARDS)
                counting = CountingMeta(client)
                cache = CatalogCache(counting, refresh_interval_s=3600)
                await cache.start()
                try:
                    assert counting.calls == 1
                    for _ in range(1000):
                        assert cache.lookup(TableRef("robots", "rewards")) is not None
                        assert cache.lookup(TableRef("robots", "absent")) is None
                        assert [str(t.table) for t in cache.tables()] == ["robots.rewards"]
                    assert counting.calls == 1
                    # Unchanged generation: Metasrv answers not_modified.
                    assert await cache.refresh() is False
                    await client.create_table(TableRef("robots", "later"), REWARDS)
                    assert await cache.refresh() is True
                    assert cache.lookup(TableRef("robots", "later")) is not None
                finally:
                    await cache.close()

        asyncio.run(scenario())
    finally:
        meta.stop()


def test_readme_example_runs(lake_cluster: LakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    # Installed from a checkout, with its Lake dependencies in one pip command.
    install = "pip install ./packages/lake-core ./packages/lake-objects ./packages/lake-query"
    assert readme.startswith(f"# lake-query\n\n```\n{install}\n```")
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]

    async def create() -> None:
        async with MetaClient(f"http://{lake_cluster.meta.addr}") as meta:
            schema = pa.schema([("episode_id", pa.int64()), ("reward", pa.float64())])
            await meta.create_table(TableRef("robots", "episodes"), schema)

    asyncio.run(create())
    exec(example.replace("grpc://127.0.0.1:50051", lake_cluster.query.url), {})
    out = capsys.readouterr().out
    assert "[(0,)]" in out
    assert "episodes" in out
