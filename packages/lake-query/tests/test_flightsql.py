"""The Flight SQL service against real clients: pyarrow Flight and ADBC.

The server runs in-process over local Lance datasets (``LocalCatalog`` as the
catalog authority); ``tests/test_query_process.py`` repeats the essentials
against real ``lake meta`` and ``lake query`` processes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import adbc_driver_flightsql.dbapi as adbc
import adbc_driver_manager
import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.errors import READ_ONLY_MESSAGE
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_grpc
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_core.tickets import TicketKeyRing
from lake_query.jobs.service import is_handle

from .conftest import (
    EPISODES_ROWS,
    ROBOTS_ONLY,
    LocalCatalog,
    RunningQuery,
    episodes,
    start_server,
)

ROWS_SQL = """
    WITH good AS (SELECT episode_id, reward FROM robots.rewards WHERE reward >= 0)
    SELECT e.episode_id, e.robot, e.duration_s, e.ok, g.reward
    FROM lake.robots.episodes e JOIN good g ON e.episode_id = g.episode_id
    WHERE e.episode_id IN (SELECT episode_id FROM robots.rewards)
    ORDER BY e.episode_id
"""
ROWS_SCHEMA = pa.schema(
    [
        ("episode_id", pa.int64()),
        ("robot", pa.utf8()),
        ("duration_s", pa.float64()),
        ("ok", pa.bool_()),
        ("reward", pa.float32()),
    ]
)


def command(message: Any) -> bytes:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return wrapper.SerializeToString()


def statement(sql: str) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(command(sql_pb.CommandStatementQuery(query=sql)))


@pytest.fixture
def client(query_server: RunningQuery) -> Iterator[flight.FlightClient]:
    with flight.connect(query_server.url) as connected:
        yield connected


@pytest.fixture
def conn(query_server: RunningQuery) -> Iterator[Any]:
    with adbc.connect(query_server.url, autocommit=True) as connected:
        yield connected


def fetch(client: flight.FlightClient, descriptor: flight.FlightDescriptor) -> pa.Table:
    info = client.get_flight_info(descriptor)
    return client.do_get(info.endpoints[0].ticket).read_all()


def test_pyarrow_statement_query_join_subquery_cte(client: flight.FlightClient) -> None:
    info = client.get_flight_info(statement(ROWS_SQL))
    assert info.schema == ROWS_SCHEMA
    reader = client.do_get(info.endpoints[0].ticket)
    batches = [chunk.data for chunk in reader]
    table = pa.Table.from_batches(batches)
    assert table.schema == ROWS_SCHEMA
    assert table.num_rows == EPISODES_ROWS
    assert len(batches) >= 1
    assert table.column("episode_id").to_pylist() == list(range(EPISODES_ROWS))
    assert table.slice(7, 1).to_pylist()[0] == {
        "episode_id": 7,
        "robot": "robot-0",
        "duration_s": 1.75,
        "ok": True,
        "reward": 7.0,
    }


def test_adbc_dbapi_end_to_end(conn: Any, query_server: RunningQuery) -> None:
    with conn.cursor() as cur:
        cur.execute(ROWS_SQL)
        reader = cur.fetch_record_batch()
        batches = list(reader)
    table = pa.Table.from_batches(batches)
    assert table.schema == ROWS_SCHEMA
    assert table.num_rows == EPISODES_ROWS
    assert table.column("episode_id").to_pylist() == list(range(EPISODES_ROWS))

    with conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM robots.episodes WHERE episode_id < $1", (100,))
        assert cur.fetchall() == [(100,)]


def test_adbc_results_arrive_in_several_batches(conn: Any) -> None:
    sql = (
        "SELECT e.*, repeat(e.robot, 40) AS pad FROM robots.episodes e "
        "CROSS JOIN (SELECT 1 AS x UNION ALL SELECT 2 UNION ALL SELECT 3) k"
    )
    with conn.cursor() as cur:
        cur.execute(sql)
        batches = list(cur.fetch_record_batch())
    assert sum(b.num_rows for b in batches) == EPISODES_ROWS * 3
    assert len(batches) >= 2


def test_adbc_get_objects_lists_real_schemas(
    conn: Any, catalog: LocalCatalog, query_server: RunningQuery
) -> None:
    calls = catalog.calls
    objects = conn.adbc_get_objects().read_all().to_pylist()
    assert catalog.calls == calls, "warm discovery must not call the catalog source"
    assert [c["catalog_name"] for c in objects] == ["lake"]
    schemas = {s["db_schema_name"]: s for s in objects[0]["catalog_db_schemas"]}
    assert set(schemas) == {"robots", "secret"}
    tables = {t["table_name"]: t for t in schemas["robots"]["db_schema_tables"]}
    assert set(tables) == {"episodes", "rewards"}
    columns = [c["column_name"] for c in tables["rewards"]["table_columns"]]
    assert columns == ["episode_id", "reward"]
    assert conn.adbc_get_table_schema("rewards", db_schema_filter="robots") == pa.schema(
        [("episode_id", pa.int64()), ("reward", pa.float32())]
    )
    assert conn.adbc_get_table_types() == ["TABLE"]


def test_adbc_dml_gets_the_read_only_error(conn: Any, tmp_path: Any) -> None:
    target = tmp_path / "out.csv"
    for sql in (
        "INSERT INTO robots.episodes VALUES (1, 'x', 1.0, true)",
        "DELETE FROM robots.episodes",
        "DROP TABLE robots.episodes",
        f"COPY (SELECT 1) TO '{target}'",
    ):
        with conn.cursor() as cur, pytest.raises(adbc_driver_manager.ProgrammingError) as caught:
            cur.execute(sql)
        assert READ_ONLY_MESSAGE in str(caught.value)
    assert not target.exists()


def test_adbc_ingest_needs_a_replica_that_takes_appends(conn: Any) -> None:
    # Bulk ingest streams to Metasrv (tests/interop/test_adbc_ingest.py); this
    # replica has no append sink, so it refuses ingests as it refuses appends.
    data = pa.table({"episode_id": pa.array([1], pa.int64())})
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.NotSupportedError) as caught:
        cur.adbc_ingest("episodes", data, mode="append", db_schema_name="robots")
    assert "does not accept appends" in str(caught.value)


def test_adbc_errors_have_grpc_meaning(conn: Any) -> None:
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.ProgrammingError) as caught:
        cur.execute("SELEC 1")
    assert "ParserError" in str(caught.value)
    with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as missing:
        cur.execute("SELECT * FROM robots.missing")
    assert "lake.robots.missing" in str(missing.value)


def test_unknown_table_is_not_found(query_server: RunningQuery) -> None:
    with grpc.insecure_channel(query_server.addr) as channel:
        stub = flight_grpc.FlightServiceStub(channel)
        descriptor = pb.FlightDescriptor(
            type=pb.FlightDescriptor.CMD,
            cmd=command(sql_pb.CommandStatementQuery(query="SELECT * FROM robots.missing")),
        )
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetFlightInfo(descriptor)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "lake.robots.missing" in caught.value.details()


def test_ticket_pins_survive_an_append(
    client: flight.FlightClient, catalog: LocalCatalog, query_server: RunningQuery
) -> None:
    info = client.get_flight_info(statement("SELECT * FROM robots.episodes"))
    catalog.append("robots.episodes", episodes(EPISODES_ROWS, 1000))
    query_server.call(query_server.cache.refresh())
    table = client.do_get(info.endpoints[0].ticket).read_all()
    assert table.num_rows == EPISODES_ROWS
    assert table.schema == info.schema
    assert fetch(client, statement("SELECT * FROM robots.episodes")).num_rows == (
        EPISODES_ROWS + 1000
    )


def test_planning_miss_refreshes_the_catalog_once(
    client: flight.FlightClient, catalog: LocalCatalog
) -> None:
    catalog.create("robots.fresh", pa.table({"x": pa.array([1, 2, 3], pa.int64())}))
    calls = catalog.calls
    assert fetch(client, statement("SELECT * FROM robots.fresh")).num_rows == 3
    assert catalog.calls == calls + 1
    assert fetch(client, statement("SELECT * FROM robots.fresh")).num_rows == 3
    assert catalog.calls == calls + 1


def test_tickets_redeem_on_another_replica_but_not_for_another_principal(
    catalog: LocalCatalog,
) -> None:
    ring = TicketKeyRing.ephemeral()
    first, t1, stop1 = start_server(catalog, ring=ring)
    second, t2, stop2 = start_server(catalog, ring=ring)
    stranger, t3, stop3 = start_server(catalog, ring=ring, principal=ROBOTS_ONLY)
    try:
        with flight.connect(first.url) as one:
            info = one.get_flight_info(statement("SELECT * FROM robots.rewards"))
        catalog.append(
            "robots.rewards",
            pa.table({"episode_id": [1], "reward": [1.0]}).cast(
                pa.schema([("episode_id", pa.int64()), ("reward", pa.float32())])
            ),
        )
        with flight.connect(second.url) as two:
            assert two.do_get(info.endpoints[0].ticket).read_all().num_rows == EPISODES_ROWS
        with flight.connect(stranger.url) as three, pytest.raises(flight.FlightError) as caught:
            three.do_get(info.endpoints[0].ticket).read_all()
        assert "another principal" in str(caught.value)
    finally:
        for running, thread, stop in (
            (first, t1, stop1),
            (second, t2, stop2),
            (stranger, t3, stop3),
        ):
            running.loop.call_soon_threadsafe(stop.set)
            thread.join(30)


def test_flight_sql_metadata_commands(client: flight.FlightClient) -> None:
    catalogs = fetch(
        client, flight.FlightDescriptor.for_command(command(sql_pb.CommandGetCatalogs()))
    )
    assert catalogs.to_pylist() == [{"catalog_name": "lake"}]
    schemas = fetch(
        client,
        flight.FlightDescriptor.for_command(
            command(sql_pb.CommandGetDbSchemas(db_schema_filter_pattern="rob%"))
        ),
    )
    assert schemas.to_pylist() == [{"catalog_name": "lake", "db_schema_name": "robots"}]
    tables = fetch(
        client,
        flight.FlightDescriptor.for_command(
            command(
                sql_pb.CommandGetTables(
                    db_schema_filter_pattern="robots",
                    table_name_filter_pattern="re_ards",
                    include_schema=True,
                )
            )
        ),
    )
    assert tables.column("table_name").to_pylist() == ["rewards"]
    schema = pa.ipc.read_schema(pa.py_buffer(tables.column("table_schema")[0].as_py()))
    assert schema == pa.schema([("episode_id", pa.int64()), ("reward", pa.float32())])
    types = fetch(
        client, flight.FlightDescriptor.for_command(command(sql_pb.CommandGetTableTypes()))
    )
    assert types.to_pylist() == [{"table_type": "TABLE"}]
    info = fetch(
        client,
        flight.FlightDescriptor.for_command(
            command(sql_pb.CommandGetSqlInfo(info=[sql_pb.FLIGHT_SQL_SERVER_TRANSACTION, 3]))
        ),
    )
    assert info.to_pylist() == [
        {"info_name": 8, "value": sql_pb.SQL_SUPPORTED_TRANSACTION_NONE},
        {"info_name": 3, "value": True},
    ]


def test_discovery_hides_namespaces_the_caller_may_not_see(catalog: LocalCatalog) -> None:
    running, thread, stop = start_server(catalog, principal=ROBOTS_ONLY)
    try:
        with adbc.connect(running.url, autocommit=True) as conn:
            objects = conn.adbc_get_objects().read_all().to_pylist()
            names = [s["db_schema_name"] for s in objects[0]["catalog_db_schemas"]]
            assert names == ["robots"]
            with conn.cursor() as cur, pytest.raises(adbc_driver_manager.Error) as caught:
                cur.execute("SELECT * FROM secret.plans")
            assert "permission denied" in str(caught.value)
    finally:
        running.loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def raw_stub(query_server: RunningQuery) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(query_server.addr)
    return channel, flight_grpc.FlightServiceStub(channel)


def test_poll_flight_info_completes_at_once(query_server: RunningQuery) -> None:
    channel, stub = raw_stub(query_server)
    with channel:
        descriptor = pb.FlightDescriptor(
            type=pb.FlightDescriptor.CMD,
            cmd=command(sql_pb.CommandStatementQuery(query="SELECT 41 + 1 AS answer")),
        )
        poll = stub.PollFlightInfo(descriptor)
    assert not poll.HasField("flight_descriptor")
    assert poll.progress == 1.0
    info = flight.FlightInfo.deserialize(poll.info.SerializeToString())
    with flight.connect(query_server.url) as client:
        assert client.do_get(info.endpoints[0].ticket).read_all().to_pylist() == [{"answer": 42}]


def test_session_and_statement_actions(query_server: RunningQuery) -> None:
    channel, stub = raw_stub(query_server)
    with channel:
        created = list(
            stub.DoAction(
                pb.Action(
                    type="CreatePreparedStatement",
                    body=command(
                        sql_pb.ActionCreatePreparedStatementRequest(
                            query="SELECT reward FROM robots.rewards"
                        )
                    ),
                )
            )
        )
        wrapper = any_pb2.Any.FromString(created[0].body)
        result = sql_pb.ActionCreatePreparedStatementResult()
        assert wrapper.Unpack(result)
        schema = pa.ipc.read_schema(pa.py_buffer(result.dataset_schema))
        assert schema == pa.schema([("reward", pa.float32())])
        close = sql_pb.ActionClosePreparedStatementRequest(
            prepared_statement_handle=result.prepared_statement_handle
        )
        assert (
            list(stub.DoAction(pb.Action(type="ClosePreparedStatement", body=command(close)))) == []
        )
        session = list(stub.DoAction(pb.Action(type="CloseSession", body=b"")))
        assert pb.CloseSessionResult.FromString(session[0].body).status == (
            pb.CloseSessionResult.CLOSED
        )
        cancel = list(
            stub.DoAction(
                pb.Action(
                    type="CancelFlightInfo",
                    body=pb.CancelFlightInfoRequest(info=pb.FlightInfo()).SerializeToString(),
                )
            )
        )
        assert pb.CancelFlightInfoResult.FromString(cancel[0].body).status == (
            pb.CANCEL_STATUS_CANCELLED
        )
        # An async job's handle, on a replica running no async queries: nothing is cancelled.
        job = b"LKT1" + bytes(48)
        assert is_handle(job)
        handle = pb.FlightInfo(flight_descriptor=pb.FlightDescriptor(type=2, cmd=job))
        refused = list(
            stub.DoAction(
                pb.Action(
                    type="CancelFlightInfo",
                    body=pb.CancelFlightInfoRequest(info=handle).SerializeToString(),
                )
            )
        )
        assert pb.CancelFlightInfoResult.FromString(refused[0].body).status == (
            pb.CANCEL_STATUS_NOT_CANCELLABLE
        )
        listed = {a.type for a in stub.ListActions(pb.Empty())}
        assert {"CreatePreparedStatement", "lake.table_schema"} <= listed


def test_table_schema_action(query_server: RunningQuery) -> None:
    channel, stub = raw_stub(query_server)
    with channel:
        body = protocol.encode(protocol.TableRequest(table=TableRef("robots", "rewards")))
        reply = list(stub.DoAction(pb.Action(type="lake.table_schema", body=body)))
        result = protocol.decode(protocol.DescribeTableResult, reply[0].body)
        assert result.entry.table == TableRef("robots", "rewards")
        body = json.dumps({"schema_version": 1, "table": {"namespace": "robots", "name": "nah"}})
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.DoAction(pb.Action(type="lake.table_schema", body=body.encode())))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def put_stream(descriptor_cmd: bytes, table: pa.Table) -> Iterator[pb.FlightData]:
    from lake_core.flight.encoding import encode_stream

    descriptor = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=descriptor_cmd)
    for raw in encode_stream(
        table.schema, table.to_batches(), descriptor=descriptor.SerializeToString()
    ):
        yield pb.FlightData.FromString(raw)


def test_statement_updates_are_read_only(query_server: RunningQuery) -> None:
    channel, stub = raw_stub(query_server)
    data = pa.table({"episode_id": pa.array([1], pa.int64())})
    with channel:
        for cmd in (
            sql_pb.CommandStatementUpdate(query="SELECT 1"),
            sql_pb.CommandPreparedStatementUpdate(prepared_statement_handle=b"x"),
        ):
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.DoPut(put_stream(command(cmd), data)))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == READ_ONLY_MESSAGE
        # Bulk ingest is not an update: it is refused here only for want of an append sink.
        ingest = sql_pb.CommandStatementIngest(table="episodes", schema="robots")
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.DoPut(put_stream(command(ingest), data)))
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


class RecordingAppends:
    """An AppendSink that records what Query forwards and answers like Metasrv."""

    def __init__(self, catalog: LocalCatalog) -> None:
        self.catalog = catalog
        self.messages: list[pb.FlightData] = []
        self.on_behalf_of: list[Principal | None] = []

    async def append_messages(
        self, messages: AsyncIterator[pb.FlightData], *, on_behalf_of: Principal | None = None
    ) -> protocol.AppendResult:
        self.on_behalf_of.append(on_behalf_of)
        async for message in messages:
            self.messages.append(message)
        command = protocol.decode(protocol.AppendCommand, self.messages[0].flight_descriptor.cmd)
        entry = self.catalog.append(str(command.table), episodes(EPISODES_ROWS, 10))
        return protocol.AppendResult(
            table=command.table,
            operation_id=command.operation_id,
            version=entry.descriptor.version,
            descriptor=TableDescriptor.model_validate(entry.descriptor.model_dump()),
        )


def test_append_doput_is_authorized_forwarded_and_refreshes(catalog: LocalCatalog) -> None:
    sink = RecordingAppends(catalog)
    running, thread, stop = start_server(catalog, appends=sink, principal=ROBOTS_ONLY)
    try:
        channel, stub = raw_stub(running)
        data = episodes(EPISODES_ROWS, 10)
        with channel:
            append = protocol.AppendCommand(
                table=TableRef("robots", "episodes"),
                operation_id="0190f1e2-0000-7000-8000-000000000001",
            )
            replies = list(stub.DoPut(put_stream(protocol.encode(append), data)))
            result = protocol.decode(protocol.AppendResult, replies[0].app_metadata)
            assert result.version == 2
            assert len(sink.messages) == 2  # schema + one batch, forwarded unchanged
            # Forwarded on behalf of the caller, so Metasrv authorizes it again.
            assert sink.on_behalf_of == [ROBOTS_ONLY]
            # Refreshed before the reply: this replica reads its own write.
            assert running.cache.entry(TableRef("robots", "episodes")).descriptor.version == 2

            hidden = protocol.AppendCommand(
                table=TableRef("secret", "plans"),
                operation_id="0190f1e2-0000-7000-8000-000000000002",
            )
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.DoPut(put_stream(protocol.encode(hidden), data)))
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert len(sink.messages) == 2
    finally:
        running.loop.call_soon_threadsafe(stop.set)
        thread.join(30)
