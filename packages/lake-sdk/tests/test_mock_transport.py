"""Unit tests on MockTransport: a client against an in-memory Query, no server, no network."""

from __future__ import annotations

import pyarrow as pa
import pytest

import lake_sdk

RUNS = pa.schema([pa.field("id", pa.int64()), pa.field("robot", pa.string())])


def _transport() -> lake_sdk.MockTransport:
    transport = lake_sdk.MockTransport()
    transport.add_table("robots.runs", pa.table({"id": [1, 2], "robot": ["a", "b"]}, RUNS))
    return transport


def test_a_blocking_client_queries_and_appends_in_memory() -> None:
    transport = _transport()
    with lake_sdk.Client("mock://", transport=transport) as client:
        result = client.query("SELECT * FROM robots.runs")
        assert isinstance(result, lake_sdk.QueryResult)
        assert result.to_table().column("id").to_pylist() == [1, 2]
        more = pa.table({"id": [3], "robot": ["c"]}, RUNS)
        assert client.append_batches("robots.runs", more) == 1
        assert client.insert("INSERT INTO robots.runs (id, robot) VALUES (?, ?)", [4, "d"]) == 2
        assert client.query_table("SELECT * FROM robots.runs").num_rows == 4
    assert transport.closed
    assert transport.calls[0] == "wait_ready"
    assert transport.calls.count("append") == 2


@pytest.mark.asyncio
async def test_an_asyncio_client_creates_lists_and_drops_tables() -> None:
    transport = lake_sdk.MockTransport()
    async with lake_sdk.AsyncClient("mock://", transport=transport) as client:
        info = await client.create_table("robots.runs", RUNS)
        assert (info.version, info.schema) == (0, RUNS)
        with pytest.raises(lake_sdk.TableExists):
            await client.create_table("robots.runs", RUNS)
        assert [str(t.table) for t in await client.list_tables()] == ["robots.runs"]
        assert await client.ingest("robots.runs", pa.table({"id": [7], "robot": ["g"]}, RUNS)) == 1
        result = await client.query("SELECT * FROM robots.runs")
        assert isinstance(result, lake_sdk.AsyncQueryResult)
        assert sum([batch.num_rows async for batch in result]) == 1
        assert await client.drop_table("robots.runs") == 1
        with pytest.raises(lake_sdk.TableNotFound):
            await client.describe_table("robots.runs")


def test_an_operation_id_commits_once() -> None:
    transport = _transport()
    row = pa.table({"id": [3], "robot": ["c"]}, RUNS)
    with lake_sdk.Client("mock://", transport=transport) as client:
        first = client.append_batches("robots.runs", row, operation_id=OPERATION)
        again = client.append_batches("robots.runs", row, operation_id=OPERATION)
    assert first == again == 1
    assert transport.table("robots.runs").num_rows == 3


def test_the_query_function_answers_any_sql() -> None:
    transport = lake_sdk.MockTransport(query=lambda sql: pa.table({"sql": [sql]}))
    with lake_sdk.Client("mock://", transport=transport) as client:
        assert client.query_table("SELECT 1").column("sql").to_pylist() == ["SELECT 1"]


def test_errors_are_the_lake_classes_a_server_would_send() -> None:
    with lake_sdk.Client("mock://", transport=lake_sdk.MockTransport()) as client:
        with pytest.raises(lake_sdk.TableNotFound):
            client.table_schema("robots.nope")
        with pytest.raises(lake_sdk.Unimplemented, match="SELECT \\* FROM"):
            client.query_table("SELECT count(*) FROM robots.nope")
    unreachable = lake_sdk.Client("mock://", transport=lake_sdk.MockTransport(available=False))
    with pytest.raises(lake_sdk.Unavailable, match="not reachable"):
        unreachable.__enter__()


def test_a_transport_must_be_a_transport() -> None:
    with pytest.raises(lake_sdk.InvalidArgument, match=r"lake_sdk\.Transport"):
        lake_sdk.AsyncClient("mock://", transport=object())  # type: ignore[arg-type]


#: A UUIDv7 operation id (what new_operation_id makes).
OPERATION = "0190a5b2-7c3d-7e4f-8a1b-2c3d4e5f6a7b"
