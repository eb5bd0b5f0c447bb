"""pyarrow's own Flight client speaking Flight SQL to a real ``lake query``."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.proto import flight_sql_pb2
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import LakeCluster


def command(message: object) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def redeem(
    client: flight.FlightClient, endpoint: flight.FlightEndpoint
) -> flight.FlightStreamReader:
    """DoGet where the endpoint says: pyarrow does not follow locations by itself."""
    if not endpoint.locations:
        return client.do_get(endpoint.ticket)
    return flight.FlightClient(endpoint.locations[0]).do_get(endpoint.ticket)


def fetch(client: flight.FlightClient, descriptor: flight.FlightDescriptor) -> pa.Table:
    info = client.get_flight_info(descriptor)
    assert len(info.endpoints) >= 1
    tables = [redeem(client, ep).read_all() for ep in info.endpoints]
    table = pa.concat_tables(tables)
    assert table.schema.equals(info.schema)
    return table


def _client(cluster: LakeCluster) -> Iterator[flight.FlightClient]:
    create_table(cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    with lake_sdk.connect(cluster.query.url) as sdk:
        sdk.append_batches(EPISODES, [episodes(0, 10_000)])
        sdk.append_batches(EPISODES, [episodes(10_000, 10_000)])
    with flight.FlightClient(f"grpc+tcp://{cluster.query.addr}") as c:
        yield c


@pytest.fixture
def client(lake_cluster: LakeCluster) -> Iterator[flight.FlightClient]:
    yield from _client(lake_cluster)


@pytest.fixture
def client_paths(doget_cluster: LakeCluster) -> Iterator[flight.FlightClient]:
    """``client``, once per DoGet path (grpcio, the native data plane)."""
    yield from _client(doget_cluster)


def test_statement_query_returns_all_rows_in_several_batches(
    client_paths: flight.FlightClient,
) -> None:
    client = client_paths
    descriptor = command(
        flight_sql_pb2.CommandStatementQuery(query="SELECT * FROM robots.episodes")
    )
    info = client.get_flight_info(descriptor)
    reader = redeem(client, info.endpoints[0])
    batches = [chunk.data for chunk in reader]
    assert len(batches) > 1
    table = pa.Table.from_batches(batches).sort_by("steps")
    assert table.schema.equals(EPISODES_SCHEMA)
    assert table.equals(pa.Table.from_batches([episodes(0, 20_000)]))


def test_group_by(client: flight.FlightClient) -> None:
    sql = "SELECT robot_id, count(*) AS n FROM lake.robots.episodes GROUP BY robot_id ORDER BY robot_id"
    table = fetch(client, command(flight_sql_pb2.CommandStatementQuery(query=sql)))
    assert table.to_pydict() == {"robot_id": [f"robot-{i}" for i in range(5)], "n": [4000] * 5}


def test_catalog_commands(client_paths: flight.FlightClient) -> None:
    client = client_paths
    catalogs = fetch(client, command(flight_sql_pb2.CommandGetCatalogs()))
    assert catalogs.column("catalog_name").to_pylist() == ["lake"]
    schemas = fetch(client, command(flight_sql_pb2.CommandGetDbSchemas()))
    assert schemas.column("db_schema_name").to_pylist() == ["robots"]
    tables = fetch(client, command(flight_sql_pb2.CommandGetTables(include_schema=True)))
    assert tables.column("table_name").to_pylist() == ["episodes"]
    schema = pa.ipc.read_schema(pa.py_buffer(tables.column("table_schema")[0].as_py()))
    assert schema.equals(EPISODES_SCHEMA)
    types = fetch(client, command(flight_sql_pb2.CommandGetTableTypes()))
    assert "TABLE" in types.column("table_type").to_pylist()


def test_errors_are_typed(client: flight.FlightClient) -> None:
    with pytest.raises(pa.ArrowInvalid, match="Lake SQL is read-only"):
        client.get_flight_info(
            command(flight_sql_pb2.CommandStatementQuery(query="DELETE FROM robots.episodes"))
        )
    with pytest.raises(pa.ArrowInvalid):
        client.get_flight_info(command(flight_sql_pb2.CommandStatementQuery(query="SELEC nope")))
    with pytest.raises(pa.ArrowKeyError, match=r"lake\.robots\.missing"):
        client.get_flight_info(
            command(flight_sql_pb2.CommandStatementQuery(query="SELECT * FROM robots.missing"))
        )
    update = command(flight_sql_pb2.CommandStatementUpdate(query="DELETE FROM robots.episodes"))
    with pytest.raises(pa.ArrowInvalid, match="Lake SQL is read-only"):
        _put_nothing(client, update)


def _put_nothing(client: flight.FlightClient, descriptor: flight.FlightDescriptor) -> None:
    writer, reader = client.do_put(descriptor, pa.schema([]))
    writer.done_writing()
    reader.read()
    writer.close()
