"""The native data plane records the main listener's RPC series and SERVER span.

A DoGet on ``LAKE_QUERY_DATA_ADDR`` carrying a W3C ``traceparent`` shows up as
``lake_rpc_duration_seconds{method="DoGet"}`` on Query's /metrics and as a
SERVER span, child of the caller's span, at a real OTLP receiver.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.config import METRICS_ADDR, QUERY_DATA_ADDR
from lake_core.proto import flight_sql_pb2 as sql_pb
from tests.telemetry.scrape import scrape, value
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.otlp import OtlpReceiver
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import LakeProcess, free_port, start_query

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def traced(lake_cluster: LakeCluster) -> Iterator[tuple[LakeProcess, int, OtlpReceiver]]:
    receiver = OtlpReceiver().start()
    metrics = free_port()
    env = {
        **lake_cluster.env,
        QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}",
        METRICS_ADDR: f"127.0.0.1:{metrics}",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    with lake_sdk.Client(lake_cluster.query.url) as client:
        client.append_batches(EPISODES, [episodes(0, 100)])
    process = start_query(lake_cluster.meta.addr, lake_cluster.root, env=env)
    try:
        yield process, metrics, receiver
    finally:
        process.stop()
        receiver.stop()


def test_a_data_plane_doget_is_measured_and_traced(
    traced: tuple[LakeProcess, int, OtlpReceiver],
) -> None:
    process, metrics, receiver = traced
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=f"SELECT * FROM {EPISODES.qualified}"))
    descriptor = flight.FlightDescriptor.for_command(wrapper.SerializeToString())
    with flight.FlightClient(f"grpc+tcp://{process.addr}") as client:
        endpoint = client.get_flight_info(descriptor).endpoints[0]
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    options = flight.FlightCallOptions(headers=[(b"traceparent", traceparent.encode())])
    with flight.FlightClient(endpoint.locations[0]) as data:
        assert data.do_get(endpoint.ticket, options).read_all().num_rows == 100
    spans = receiver.wait_for(
        lambda got: any(s.trace_id == TRACE_ID and s.parent_id == PARENT_ID for s in got)
    )
    (span,) = [s for s in spans if s.trace_id == TRACE_ID and s.parent_id == PARENT_ID]
    assert span.kind == 2  # SERVER
    assert span.attributes["rpc.method"] == "DoGet"
    assert span.attributes["rpc.grpc.status_code"] == 0
    # A fresh replica: its one DoGet is the data plane's (GetFlightInfo went to the listener).
    text = scrape(metrics)
    assert value(text, "lake_rpc_duration_seconds_count", method="DoGet", code="OK") == 1
    assert value(text, "lake_rpc_duration_seconds_count", method="GetFlightInfo", code="OK") == 1
