"""Upstream storage faults during a DoGet come back typed, never as the caller's mistake.

A real ``lake query`` federates SeaweedFS's catalog; it reads the table's S3
objects through a fault-injecting proxy (tools/lake_testing/s3proxy.py)
while pyiceberg writes and the test deletes objects directly. Between
GetFlightInfo and DoGet:

- a data file of the pinned snapshot deleted: DataCorrupted (DATA_LOSS),
  naming table and snapshot, no bucket, key or URL;
- S3 answering 503 to everything: Unavailable (retryable);
- the snapshot's manifest list damaged at rest (undecodable Avro):
  DataCorrupted, like a missing one.

Both for a plain projection (read by the plug-in's own pyarrow reader) and
for a statement DataFusion runs over iceberg-rust's scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.errors import DataCorrupted, Unavailable
from lake_core.proto import flight_sql_pb2
from tools.lake_testing.iceberg import SeaweedIceberg, proxied_query, write_episodes
from tools.lake_testing.s3proxy import S3Proxy
from tools.lake_testing.servers import LakeProcess

pytestmark = [pytest.mark.iceberg, pytest.mark.s3, pytest.mark.slow]

NAMESPACE = "faults"
#: One statement per scan path: the plug-in's reader, and DataFusion over iceberg-rust.
PATHS = {
    "direct": "SELECT episode_id, robot_id, reward FROM iceberg.faults.{table}",
    "datafusion": "SELECT robot_id, count(*) AS n FROM iceberg.faults.{table} GROUP BY robot_id",
}


@dataclass
class Faulty:
    server: SeaweedIceberg
    proxy: S3Proxy
    query: LakeProcess

    def flight(self) -> flight.FlightClient:
        return flight.FlightClient(f"grpc+tcp://{self.query.addr}")

    def leaks(self) -> list[str]:
        """Text that must never appear in an error: storage addresses and names."""
        s = self.server
        return ["s3://", s.warehouse_bucket, s.endpoint, self.proxy.endpoint, s.access_key]


@pytest.fixture(scope="module")
def faulty(
    iceberg_server: SeaweedIceberg, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Faulty]:
    root = tmp_path_factory.mktemp("federation-faults")
    iceberg_server.catalog().create_namespace(NAMESPACE)
    with proxied_query(iceberg_server, NAMESPACE, root) as (proxy, query):
        yield Faulty(iceberg_server, proxy, query)


def _descriptor(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def _delete_a_data_file(server: SeaweedIceberg, table: Any) -> None:
    path = next(iter(table.scan().plan_files())).file.file_path
    location = urlparse(path)
    server.client().delete_object(Bucket=location.netloc, Key=location.path.lstrip("/"))


def _doget_error(client: flight.FlightClient, info: flight.FlightInfo) -> str:
    with pytest.raises(pa.ArrowException) as caught:
        client.do_get(info.endpoints[0].ticket).read_all()
    return str(caught.value)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_data_file_deleted_before_doget_is_data_corrupted(faulty: Faulty, path: str) -> None:
    name = f"deleted_{path}"
    table = write_episodes(faulty.server.catalog(), NAMESPACE, name)
    snapshot = table.metadata.current_snapshot_id
    sql = PATHS[path].format(table=name)
    with faulty.flight() as client:
        info = client.get_flight_info(_descriptor(sql))
        _delete_a_data_file(faulty.server, table)
        message = _doget_error(client, info)
    assert "DATA_LOSS" in message.upper().replace(" ", "_"), message
    assert f"iceberg.{NAMESPACE}.{name} snapshot {snapshot}" in message, message
    assert "invalid argument" not in message.lower(), message
    assert not any(leak in message for leak in faulty.leaks()), message
    # Lake's own client rebuilds the exact class from the trailer code.
    with lake_sdk.Client(faulty.query.url) as sdk, pytest.raises(DataCorrupted) as typed:
        sdk.query_table(sql)
    assert not typed.value.retryable
    assert f"snapshot {snapshot}" in str(typed.value)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_storage_unavailable_during_doget_is_unavailable(faulty: Faulty, path: str) -> None:
    name = f"outage_{path}"
    write_episodes(faulty.server.catalog(), NAMESPACE, name)
    sql = PATHS[path].format(table=name)
    try:
        with faulty.flight() as client:
            info = client.get_flight_info(_descriptor(sql))
            faulty.proxy.fault = "unavailable"
            message = _doget_error(client, info)
        assert "unavailable error" in message.lower(), message  # the gRPC status
        assert "invalid argument" not in message.lower(), message
        assert f"iceberg.{NAMESPACE}.{name}" in message, message
        assert not any(leak in message for leak in faulty.leaks()), message
        with lake_sdk.Client(faulty.query.url) as sdk, pytest.raises(Unavailable) as typed:
            sdk.query_table(sql)
        assert typed.value.retryable
    finally:
        faulty.proxy.fault = None
    with lake_sdk.Client(faulty.query.url) as sdk:  # whole again once storage answers
        assert sdk.query_table(sql).num_rows > 0


def test_a_plain_scan_reads_pyiceberg_rows_through_the_proxy(faulty: Faulty) -> None:
    table = write_episodes(faulty.server.catalog(), NAMESPACE, "plain")
    expected = table.scan().to_arrow().sort_by("episode_id")
    before = faulty.proxy.total
    with lake_sdk.Client(faulty.query.url) as sdk:
        got = sdk.query_table(PATHS["direct"].format(table="plain"))
    assert got.sort_by("episode_id").to_pylist() == expected.to_pylist()
    assert faulty.proxy.total > before  # the data files were read with Query's own S3 access


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_garbled_manifest_list_is_data_corrupted(faulty: Faulty, path: str) -> None:
    name = f"garbled_{path}"
    table = write_episodes(faulty.server.catalog(), NAMESPACE, name)
    snapshot = table.metadata.current_snapshot_id
    sql = PATHS[path].format(table=name)
    try:
        with faulty.flight() as client:
            info = client.get_flight_info(_descriptor(sql))
            faulty.proxy.fault_paths = "/snap-"  # pyiceberg's manifest lists
            faulty.proxy.fault = "garble"
            message = _doget_error(client, info)
    finally:
        faulty.proxy.fault = faulty.proxy.fault_paths = None
    assert "DATA_LOSS" in message.upper().replace(" ", "_"), message
    assert f"iceberg.{NAMESPACE}.{name} snapshot {snapshot}" in message, message
    assert not any(leak in message for leak in faulty.leaks()), message
