"""An ingest stream cut short commits nothing; an ingest of zero rows, on real processes.

pyarrow's Flight writer cannot cancel a DoPut, so a client whose reader fails
can only close its stream. The SDK asks for an end marker (ingest option
``lake.end=marker``) and sends it last: a stream closed without it was cut
short, and Metasrv refuses it. Clients without the option (ADBC) are unchanged:
their close is the end. One Metasrv and one Query replica (``lake_cluster``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core import protocol
from lake_core.errors import Aborted
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_sdk._errors import TrailerCapture, calling, lake_error
from tests.interop.test_adbc_ingest import SCHEMA, T, count, rows
from tools.lake_testing.data import create_table, describe_version
from tools.lake_testing.plugin import LakeCluster

_Options = flight_sql_pb2.CommandStatementIngest.TableDefinitionOptions


Mode = Literal["append", "create", "create_append"]


def adbc_ingest(url: str, data: object, mode: Mode = "append", table: TableRef = T) -> int:
    with flightsql.connect(url) as conn, conn.cursor() as cur:
        return int(cur.adbc_ingest(table.name, data, mode=mode, db_schema_name=table.namespace))


def flight_url(cluster: LakeCluster) -> str:
    return f"grpc+tcp://{cluster.query.addr}"


def descriptor(
    *, marker: bool, create: bool = False, table: TableRef = T
) -> flight.FlightDescriptor:
    """A Flight SQL ingest command, asking for the end marker when ``marker``."""
    options = {protocol.INGEST_END_OPTION: protocol.INGEST_END_BY_MARKER} if marker else {}
    command = flight_sql_pb2.CommandStatementIngest(
        table_definition_options=_Options(
            if_not_exist=(
                _Options.TABLE_NOT_EXIST_OPTION_CREATE
                if create
                else _Options.TABLE_NOT_EXIST_OPTION_FAIL
            ),
            if_exists=_Options.TABLE_EXISTS_OPTION_APPEND,
        ),
        table=table.name,
        schema=table.namespace,
        options=options,
    )
    wrapper = any_pb2.Any()
    wrapper.Pack(command)
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def put(
    client: flight.FlightClient,
    command: flight.FlightDescriptor,
    batches: list[pa.RecordBatch],
    end: Literal["message", "batch"] | None,
) -> int:
    """One DoPut with pyarrow's own writer; its ``record_count``.

    ``end``: the end marker as a message of its own, on the last batch, or none.
    """
    writer, replies = client.do_put(command, SCHEMA)
    try:
        for index, batch in enumerate(batches):
            if end == "batch" and index == len(batches) - 1:
                writer.write_with_metadata(batch, protocol.INGEST_END)
            else:
                writer.write_batch(batch)
        if end == "message":
            writer.write_metadata(protocol.INGEST_END)
        writer.done_writing()
        reply = replies.read()
    finally:
        writer.close()
    assert reply is not None
    return int(flight_sql_pb2.DoPutUpdateResult.FromString(reply.to_pybytes()).record_count)


def test_sdk_ingest_whose_reader_fails_commits_nothing(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    failure = ValueError("the producer failed after its first batch")

    def produce() -> Iterator[pa.RecordBatch]:
        yield rows(100, 50).to_batches()[0]
        raise failure

    with lake_sdk.Client(url) as client:
        assert client.ingest(T, rows(0, 10)) == 1
        with pytest.raises(ValueError) as caught:
            client.ingest(T, pa.RecordBatchReader.from_batches(SCHEMA, produce()))
        assert caught.value is failure
        assert describe_version(lake_cluster.meta.addr, T) == 1
        assert count(url) == 10
        # The next ingest is the next version.
        assert client.ingest(T, rows(10, 5)) == 2
    assert count(url) == 15


def test_a_marked_stream_commits_only_with_its_end_marker(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    batch = rows(0, 100).to_batches()[0]
    with flight.FlightClient(flight_url(lake_cluster), middleware=[TrailerCapture()]) as client:
        marked = descriptor(marker=True)
        with calling() as trailers, pytest.raises(flight.FlightInternalError) as caught:
            put(client, marked, [batch], end=None)  # closed without the marker
        # pyarrow reports ABORTED as an internal error; the Lake class travels in the trailers.
        error = lake_error(caught.value, trailers)
        assert type(error) is Aborted
        assert "ended without its end marker; nothing was committed" in str(error)
        assert describe_version(lake_cluster.meta.addr, T) == 0
        assert count(url) == 0

        assert put(client, marked, [batch], end="message") == 100
        assert describe_version(lake_cluster.meta.addr, T) == 1
        assert put(client, marked, [rows(100, 20).to_batches()[0]], end="batch") == 20
    assert describe_version(lake_cluster.meta.addr, T) == 2
    assert count(url) == 120


def test_streams_without_the_option_end_at_their_close(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    reader = pa.RecordBatchReader.from_batches(SCHEMA, rows(0, 30_000).to_batches(10_000))
    assert adbc_ingest(url, reader) == 30_000
    assert describe_version(lake_cluster.meta.addr, T) == 1
    with flight.FlightClient(flight_url(lake_cluster)) as client:
        assert put(client, descriptor(marker=False), [rows(30_000, 10).to_batches()[0]], None) == 10
    assert describe_version(lake_cluster.meta.addr, T) == 2
    assert count(url) == 30_010


def test_an_ingest_of_zero_rows(lake_cluster: LakeCluster) -> None:
    create_table(lake_cluster.meta.addr, T, SCHEMA)
    url = lake_cluster.query.url
    # ADBC sends no message at all for zero rows (not even its command): refused, said so.
    empty_reader = pa.RecordBatchReader.from_batches(SCHEMA, [])
    fresh = TableRef("fleet", "fresh")
    refused: list[tuple[object, Mode, TableRef]] = [
        (SCHEMA.empty_table(), "append", T),
        (empty_reader, "append", T),
        (SCHEMA.empty_table(), "create", fresh),
    ]
    for data, mode, table in refused:
        with pytest.raises(adbc_driver_manager.ProgrammingError) as caught:
            adbc_ingest(url, data, mode=mode, table=table)
        assert "INVALID_ARGUMENT" in str(caught.value)
        assert (
            "DoPut carried no descriptor and no data: an ingest of zero rows "
            "(ADBC sends no message for one) has nothing to append"
        ) in str(caught.value)
    assert describe_version(lake_cluster.meta.addr, T) == 0
    with lake_sdk.Client(url) as client:
        assert "fleet.fresh" not in [t.name for t in client.list_tables()]
        # A descriptor and a schema without batches is an ingest of 0 rows: no new version.
        assert client.ingest(T, SCHEMA.empty_table()) == 0
    with flight.FlightClient(flight_url(lake_cluster)) as client:
        assert put(client, descriptor(marker=True), [], end="message") == 0
        assert put(client, descriptor(marker=False), [], end=None) == 0
        # ... and a create mode creates the table from the schema.
        create = descriptor(marker=True, create=True, table=fresh)
        assert put(client, create, [], end="message") == 0
    assert describe_version(lake_cluster.meta.addr, T) == 0
    assert describe_version(lake_cluster.meta.addr, fresh) == 0
    assert count(url) == 0
    assert count(url, fresh) == 0
