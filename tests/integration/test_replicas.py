"""Snapshot-stable tickets across two Query replicas behind one Metasrv."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

import lake_sdk
from lake_core.proto import flight_sql_pb2
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import LakeCluster


def _statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def test_ticket_from_one_replica_is_served_by_another_at_the_pinned_version(
    lake_cluster: LakeCluster,
) -> None:
    first = lake_cluster.query
    second = lake_cluster.add_query()
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    with lake_sdk.connect(first.url) as sdk:
        assert sdk.append_batches(EPISODES, [episodes(0, 100)]) == 1

    sql = "SELECT * FROM robots.episodes ORDER BY steps"
    with flight.FlightClient(f"grpc+tcp://{first.addr}") as planner:
        info = planner.get_flight_info(_statement(sql))

    # An append lands between GetFlightInfo and DoGet, through the other replica.
    with lake_sdk.connect(second.url) as sdk:
        assert sdk.append_batches(EPISODES, [episodes(100, 50)]) == 2
        assert (
            sdk.query_table("SELECT count(*) AS n FROM robots.episodes").column("n")[0].as_py()
            == 150
        )

    with flight.FlightClient(f"grpc+tcp://{second.addr}") as redeemer:
        pinned = redeemer.do_get(info.endpoints[0].ticket).read_all()
    assert pinned.schema.equals(info.schema)
    assert pinned.equals(pa.Table.from_batches([episodes(0, 100)]))


def test_a_forged_ticket_is_refused(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    with flight.FlightClient(f"grpc+tcp://{lake_cluster.query.addr}") as client:
        info = client.get_flight_info(_statement("SELECT * FROM robots.episodes"))
        raw = bytearray(info.endpoints[0].ticket.ticket)
        raw[len(raw) // 2] ^= 0x01
        try:
            client.do_get(flight.Ticket(bytes(raw))).read_all()
        except flight.FlightUnauthenticatedError:
            pass
        else:
            raise AssertionError("a ticket with a flipped byte was accepted")
