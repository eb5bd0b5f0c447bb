"""The read path while appends land (issue 30, items 2-4), on real processes.

Two Query replicas share one Metasrv that keeps a single Lance version
(``LAKE_LANCE_RETAIN_VERSIONS=1`` with no age floor,
``LAKE_LANCE_RETAIN_MIN_AGE_SECS=0``): every append reclaims the version
before it. Both replicas refresh their catalog only once a minute
(``LAKE_QUERY_CATALOG_REFRESH_MS=60000``), so a replica that did not
forward an append keeps pointing at a reclaimed version unless the read
path itself catches up:

- A forwards appends; B only reads.
- (2) A fresh statement on B, whose view points at a reclaimed version,
  plans on the current one (one refresh, one more plan).
- (3) An SDK client that appended through A reads its rows on B at once
  (``lake-min-versions``); A answers with the new version from the commit
  result, without a catalog refresh.
- (4) A reclaimed version reaches ADBC, pyarrow and PollFlightInfo as
  FAILED_PRECONDITION with ``lake-error-code: VersionReclaimed``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.errors import CODES_HEADER, ERROR_CODE_KEY, WANTS_CODES, VersionReclaimed
from lake_core.min_versions import MIN_VERSIONS_HEADER
from lake_core.names import TableRef
from lake_core.proto import flight_grpc, flight_sql_pb2
from lake_core.proto import flight_pb2 as pb
from lake_sdk._errors import TrailerCapture, calling, lake_error
from tests.telemetry.scrape import scrape, value
from tools.lake_testing.balancer import Balancer
from tools.lake_testing.data import EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query

pytestmark = pytest.mark.slow

ROWS = 50
T = TypeVar("T")


class Replicas:
    def __init__(self, root: Path, retain: int) -> None:
        self.root = root
        self.env = {
            "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
            "LAKE_LANCE_RETAIN_VERSIONS": str(retain),
            "LAKE_LANCE_RETAIN_MIN_AGE_SECS": "0",
            "LAKE_COMPACTION": "off",
            "LAKE_QUERY_CATALOG_REFRESH_MS": "60000",
            "LAKE_ASYNC_QUERIES": "true",
        }
        self.processes: list[LakeProcess] = []
        self.meta = self._keep(start_meta(root / "data", root, env=self.env))
        self.a_metrics = free_port()
        # Async jobs keep their records beside the catalog (local mode).
        jobs = ("--data-dir", str(root / "data"))
        self.a = self._keep(
            start_query(
                self.meta.addr,
                root,
                env={**self.env, "LAKE_METRICS_ADDR": f"127.0.0.1:{self.a_metrics}"},
                extra_args=jobs,
            )
        )
        self.b = self._keep(start_query(self.meta.addr, root, env=self.env, extra_args=jobs))

    def _keep(self, process: LakeProcess) -> LakeProcess:
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """Every append reclaims the version before it."""
    running = Replicas(tmp_path_factory.mktemp("readpath"), retain=1)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def retained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """The default retention: a stale view still reads, so only catching up shows an append."""
    running = Replicas(tmp_path_factory.mktemp("readpath-retained"), retain=10)
    try:
        yield running
    finally:
        running.stop()


_tables = iter(range(1000))


def new_table(replicas: Replicas) -> TableRef:
    """A fresh table with one append (v1), known to both replicas' catalog views."""
    table = TableRef("fleet", f"t{next(_tables)}_{os.urandom(3).hex()}")
    create_table(replicas.meta.addr, table, EPISODES_SCHEMA)
    with lake_sdk.Client(replicas.a.url) as client:
        assert client.append_batches(table, [episodes(0, ROWS)]) == 1
    for replica in (replicas.a, replicas.b):
        # A statement naming a table the view lacks refreshes it (a miss): both know v1.
        assert count(replica, table) == ROWS
    return table


def statement(sql: str) -> flight.FlightDescriptor:
    command = any_pb2.Any()
    command.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(command.SerializeToString())


def count(replica: LakeProcess, table: TableRef) -> int:
    """``count(*)`` through pyarrow Flight: no Lake header of any kind."""
    with flight.connect(replica.url) as client:
        info = client.get_flight_info(statement(f"SELECT count(*) AS n FROM {table}"))
        return int(client.do_get(info.endpoints[0].ticket).read_all().column("n")[0].as_py())


def append_via(replica: LakeProcess, table: TableRef, start: int) -> int:
    with lake_sdk.Client(replica.url) as client:
        return client.append_batches(table, [episodes(start, ROWS)])


def test_a_stale_view_of_a_reclaimed_version_plans_the_current_one(replicas: Replicas) -> None:
    table = new_table(replicas)
    # Two appends through A: v1 is reclaimed; B's view still says v1 (60 s refresh).
    assert append_via(replicas.a, table, ROWS) == 2
    assert append_via(replicas.a, table, 2 * ROWS) == 3
    # pyarrow and ADBC send no Lake header: only planning itself can notice.
    assert count(replicas.b, table) == 3 * ROWS
    assert append_via(replicas.a, table, 3 * ROWS) == 4
    with flightsql.connect(replicas.b.url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) AS n FROM {table}")
        assert cur.fetchone() == (4 * ROWS,)


def test_the_forwarding_replica_reads_its_append_from_the_commit_result(
    retained: Replicas,
) -> None:
    table = new_table(retained)

    def refreshes() -> float:
        return value(scrape(retained.a_metrics), "lake_query_catalog_snapshot_refreshes_total")

    before = refreshes()
    for version in (2, 3, 4):
        assert append_via(retained.a, table, (version - 1) * ROWS) == version
        assert count(retained.a, table) == version * ROWS
    # The view moved with each commit result: no catalog snapshot was fetched for it.
    assert refreshes() == before


def moved(call: Callable[[], T]) -> T:
    """``call()`` right after the balancer cut the client's connection: a request that
    went out on the dying connection fails UNAVAILABLE (retryable), as behind any
    balancer; the retry reconnects."""
    for attempt in range(3):
        try:
            return call()
        except lake_sdk.Unavailable:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.mark.parametrize("kind", ["blocking", "async"])
def test_an_sdk_client_reads_its_appends_on_another_replica(retained: Replicas, kind: str) -> None:
    table = new_table(retained)
    balancer = Balancer(retained.a.addr)  # one address, as behind a load balancer
    sql = f"SELECT count(*) AS n FROM {table}"
    try:
        if kind == "blocking":
            with lake_sdk.Client(balancer.url) as client:
                assert client.append_batches(table, [episodes(ROWS, ROWS)]) == 2
                # B's own view is still at v1 (a minute between refreshes): a client
                # without the header reads what B has.
                assert count(retained.b, table) == ROWS
                balancer.route(retained.b.addr)
                got = [moved(lambda: client.query_table(sql)).column("n").to_pylist()]
                got.append(client.jobs.query(sql).to_table().column("n").to_pylist())
        else:

            async def scenario() -> list[list[int]]:
                async with lake_sdk.AsyncClient(balancer.url) as client:
                    assert await client.append_batches(table, [episodes(ROWS, ROWS)]) == 2
                    assert await asyncio.to_thread(count, retained.b, table) == ROWS
                    balancer.route(retained.b.addr)
                    for attempt in range(3):  # as moved(), awaited
                        try:
                            table_ = await client.query_table(sql)
                            break
                        except lake_sdk.Unavailable:
                            if attempt == 2:
                                raise
                    return [list(table_.column("n").to_pylist())]

            got = asyncio.run(scenario())
    finally:
        balancer.close()
    assert balancer.connections[retained.b.addr] >= 1  # the query went to B
    assert all(n == [2 * ROWS] for n in got)


def test_min_versions_header_is_validated(retained: Replicas) -> None:
    replicas = retained
    table = new_table(replicas)
    options = flight.FlightCallOptions(headers=[(MIN_VERSIONS_HEADER.encode(), b"fleet=3")])
    with flight.connect(replicas.b.url) as client:
        with pytest.raises(pa.ArrowInvalid, match=MIN_VERSIONS_HEADER):
            client.get_flight_info(statement(f"SELECT count(*) FROM {table}"), options)
        too_many = ",".join(f"fleet.t{i}=1" for i in range(33)).encode()
        with pytest.raises(pa.ArrowInvalid, match="more than 32 tables"):
            client.get_flight_info(
                statement(f"SELECT count(*) FROM {table}"),
                flight.FlightCallOptions(headers=[(MIN_VERSIONS_HEADER.encode(), too_many)]),
            )
    # Without the header B reads what its view has (v1); with it, the append.
    assert append_via(replicas.a, table, ROWS) == 2
    wanted = f"{table}=2".encode()
    with flight.connect(replicas.b.url) as client:
        info = client.get_flight_info(
            statement(f"SELECT count(*) AS n FROM {table}"),
            flight.FlightCallOptions(headers=[(MIN_VERSIONS_HEADER.encode(), wanted)]),
        )
        got = client.do_get(info.endpoints[0].ticket).read_all()
    assert got.column("n").to_pylist() == [2 * ROWS]


# -- (4) typed statuses -------------------------------------------------------------


def _reclaimed_v1(replicas: Replicas) -> TableRef:
    table = new_table(replicas)
    assert append_via(replicas.a, table, ROWS) == 2
    return table


def test_reclaimed_time_travel_is_failed_precondition_through_adbc(replicas: Replicas) -> None:
    table = _reclaimed_v1(replicas)
    kwargs = {f"adbc.flight.sql.rpc.call_header.{CODES_HEADER}": "1"}
    with (
        flightsql.connect(replicas.b.url, db_kwargs=kwargs) as conn,
        conn.cursor() as cur,
        pytest.raises(adbc_driver_manager.OperationalError) as caught,
    ):
        cur.execute(f'SELECT count(*) FROM {table.namespace}."{table.name}@v1"')
    # ADBC's Go driver files FAILED_PRECONDITION under its own status UNKNOWN (its
    # mapping, not the wire's); the gRPC code is named in the message.
    assert caught.value.status_code == adbc_driver_manager.AdbcStatusCode.UNKNOWN
    assert "(FailedPrecondition;" in str(caught.value)
    assert "no longer available" in str(caught.value)
    details = {bytes(k): bytes(v) for k, v in caught.value.details or ()}
    assert details[ERROR_CODE_KEY.encode()] == b"VersionReclaimed"


def test_old_ticket_is_failed_precondition_through_pyarrow(replicas: Replicas) -> None:
    table = new_table(replicas)
    with flight.connect(replicas.b.url) as client:
        info = client.get_flight_info(statement(f"SELECT * FROM {table}"))
    assert append_via(replicas.a, table, ROWS) == 2  # the ticket's v1 is reclaimed
    # pyarrow reports FAILED_PRECONDITION as ArrowInvalid, naming the status.
    with (
        flight.FlightClient(replicas.b.url, middleware=[TrailerCapture()]) as client,
        calling() as trailers,
        pytest.raises(pa.ArrowInvalid, match="precondition failed") as caught,
    ):
        client.do_get(info.endpoints[0].ticket).read_all()
    assert "no longer available" in str(caught.value)
    assert [str(v) for v in trailers[ERROR_CODE_KEY]] == ["VersionReclaimed"]
    assert isinstance(lake_error(caught.value, trailers), VersionReclaimed)


def test_reclaimed_version_is_failed_precondition_on_poll(replicas: Replicas) -> None:
    table = _reclaimed_v1(replicas)
    command = any_pb2.Any()
    command.Pack(
        flight_sql_pb2.CommandStatementQuery(
            query=f'SELECT count(*) FROM {table.namespace}."{table.name}@v1"'
        )
    )
    descriptor = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=command.SerializeToString())
    with grpc.insecure_channel(replicas.b.addr) as channel:
        stub: Any = flight_grpc.FlightServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.PollFlightInfo(
                descriptor,
                metadata=[WANTS_CODES, ("lake-async-job-id", os.urandom(16).hex())],
                timeout=30,
            )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    trailers = dict(caught.value.trailing_metadata() or ())
    assert trailers[ERROR_CODE_KEY] == "VersionReclaimed"
