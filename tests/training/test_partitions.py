"""Partitioned results: several endpoints for plain scans, read from two replicas."""

from __future__ import annotations

import time

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.config import QUERY_MIN_ENDPOINT_ROWS
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tests.training.conftest import SAMPLES_SCHEMA, Samples, rows_of, sample_rows
from tools.lake_testing.data import create_table
from tools.lake_testing.servers import start_query

ALL = "SELECT * FROM training.samples"


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def single_stream(samples: Samples) -> pa.Table:
    """The whole result as one stream: the same rows, sorted by the query itself."""
    with flight.FlightClient(f"grpc+tcp://{samples.cluster.query.addr}") as client:
        info = client.get_flight_info(statement(f"{ALL} ORDER BY id"))
        assert len(info.endpoints) == 1
        return client.do_get(info.endpoints[0].ticket).read_all()


def test_adbc_partitions_read_from_two_replicas_equal_the_single_stream(
    samples: Samples,
) -> None:
    first, second = samples.cluster.queries
    with flightsql.connect(first.url) as a, flightsql.connect(second.url) as b:
        with a.cursor() as cur:
            partitions, schema = cur.adbc_execute_partitions(ALL)
        assert schema.equals(SAMPLES_SCHEMA)
        # 400,000 rows over 40 fragments, at least 57,000 rows an endpoint: 7 endpoints.
        assert len(partitions) == 7
        tables = []
        for position, partition in enumerate(partitions):
            with (a if position % 2 else b).cursor() as cur:
                cur.adbc_read_partition(partition)
                tables.append(cur.fetch_arrow_table())
    assert all(t.num_rows > 0 for t in tables)
    got = pa.concat_tables(tables)
    whole = single_stream(samples)
    assert got.num_rows == whole.num_rows == samples.expected.num_rows
    assert rows_of(got).equals(rows_of(whole))
    assert rows_of(got).equals(samples.expected)


def test_pyarrow_flight_reads_filtered_partitions_on_either_replica(samples: Samples) -> None:
    sql = "SELECT label, id FROM training.samples WHERE label = 3"
    first, second = samples.cluster.queries
    with (
        flight.FlightClient(f"grpc+tcp://{first.addr}") as a,
        flight.FlightClient(f"grpc+tcp://{second.addr}") as b,
    ):
        info = a.get_flight_info(statement(sql))
        assert len(info.endpoints) > 1
        parts = [
            (b if position % 2 else a).do_get(endpoint.ticket).read_all()
            for position, endpoint in enumerate(info.endpoints)
        ]
    got = pa.concat_tables(parts)
    assert got.schema.equals(info.schema)
    expected = samples.expected.filter(pc.equal(samples.expected["label"], 3))
    assert rows_of(got).equals(rows_of(expected.select(["label", "id"])))


@pytest.mark.parametrize(
    "sql",
    [
        f"{ALL} ORDER BY id",
        "SELECT count(*) AS n FROM training.samples",
        "SELECT label, sum(value) AS s FROM training.samples GROUP BY label",
        f"{ALL} LIMIT 10",
        "SELECT DISTINCT label FROM training.samples",
        "SELECT a.id FROM training.samples a JOIN training.samples b ON a.id = b.id",
        "SELECT * FROM (SELECT * FROM training.samples LIMIT 5) t",
    ],
)
def test_queries_that_need_one_stream_keep_one_endpoint(samples: Samples, sql: str) -> None:
    with flight.FlightClient(f"grpc+tcp://{samples.cluster.query.addr}") as client:
        info = client.get_flight_info(statement(sql))
    assert len(info.endpoints) == 1


def test_a_tampered_partition_ticket_is_refused(samples: Samples) -> None:
    with flight.FlightClient(f"grpc+tcp://{samples.cluster.query.addr}") as client:
        info = client.get_flight_info(statement(ALL))
        assert len(info.endpoints) > 1
        raw = bytearray(info.endpoints[1].ticket.ticket)
        raw[len(raw) // 2] ^= 0x01
        with pytest.raises(flight.FlightUnauthenticatedError):
            client.do_get(flight.Ticket(bytes(raw))).read_all()
        # Another caller's ticket kinds cannot be swapped either: the untampered one works.
        assert client.do_get(info.endpoints[1].ticket).read_all().num_rows > 0


def test_partition_tickets_read_their_pinned_version_after_an_append(samples: Samples) -> None:
    """Endpoints planned by a replica with small partitions, redeemed by another after an append."""
    cluster = samples.cluster
    table = TableRef("training", "pinned")
    create_table(cluster.meta.addr, table, SAMPLES_SCHEMA)
    small = start_query(
        cluster.meta.addr, cluster.root, env={**cluster.env, QUERY_MIN_ENDPOINT_ROWS: "1000"}
    )
    try:
        with lake_sdk.Client(small.url) as client:
            for start in range(0, 50_000, 10_000):
                client.append_batches(table, [sample_rows(start, 10_000)])
        sql = "SELECT * FROM training.pinned"
        with flight.FlightClient(f"grpc+tcp://{small.addr}") as planner:
            info = planner.get_flight_info(statement(sql))
        assert len(info.endpoints) == 5  # one fragment per append
        with lake_sdk.Client(cluster.query.url) as client:
            client.append_batches(table, [sample_rows(50_000, 10_000)])
            deadline = time.monotonic() + 30
            while client.query_table(sql).num_rows != 60_000:
                assert time.monotonic() < deadline, "the append never became visible"
                time.sleep(0.1)
        with flight.FlightClient(f"grpc+tcp://{cluster.query.addr}") as redeemer:
            parts = [redeemer.do_get(e.ticket).read_all() for e in info.endpoints]
    finally:
        small.stop()
    got = pa.concat_tables(parts)
    assert [p.num_rows for p in parts] == [10_000] * 5
    assert rows_of(got).equals(rows_of(pa.Table.from_batches([sample_rows(0, 50_000)])))
