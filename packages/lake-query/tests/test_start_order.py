"""``lake query`` and ``lake meta`` start in any order (real processes, real clients).

A replica started before its Metasrv stays up, reports NOT_SERVING on gRPC
Health and refuses statements at once with UNAVAILABLE until it holds a
catalog, then serves within about a second of Metasrv answering. A replica
that has its catalog keeps serving reads through a Metasrv restart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lake_core import protocol
from lake_core.errors import CommitStateUnknown, LakeError
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2 as sql_pb
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query
from tools.lake_testing.waiting import until

pytestmark = pytest.mark.slow

SCHEMA = pa.schema([("id", pa.int64())])
TABLE = TableRef("robots", "order")
#: The contract is one second; the bound leaves room for a loaded machine.
SERVES_WITHIN_S = 3.0


def health(process: LakeProcess) -> int | None:
    """``process``'s gRPC Health status, None while it does not answer."""
    with grpc.insecure_channel(process.addr) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.0
            )
        except grpc.RpcError:
            return None
    return int(reply.status)


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def select(query: LakeProcess, sql: str) -> list[dict[str, object]]:
    with flight.connect(query.url) as client:
        info = client.get_flight_info(statement(sql))
        rows: list[dict[str, object]] = (
            client.do_get(info.endpoints[0].ticket).read_all().to_pylist()
        )
        return rows


async def _create(meta: LakeProcess, table: TableRef) -> None:
    async with MetaClient(meta.http_url) as client:
        await client.create_table(table, SCHEMA)


async def _append(query: LakeProcess, table: TableRef, ids: list[int]) -> None:
    async with MetaClient(query.url) as client:
        command = protocol.AppendCommand(table=table, operation_id=new_operation_id())
        batch = pa.record_batch([pa.array(ids, pa.int64())], schema=SCHEMA)
        await client.append(command, SCHEMA, [batch])


@pytest.fixture
def processes() -> Iterator[list[LakeProcess]]:
    started: list[LakeProcess] = []
    try:
        yield started
    finally:
        for process in reversed(started):
            process.stop()


def test_query_started_before_metasrv_serves_once_it_answers(
    tmp_path: Path, processes: list[LakeProcess]
) -> None:
    meta_port = free_port()
    addr = f"127.0.0.1:{free_port()}"
    args = ["-m", "lake_query", "--addr", addr, "--metadata-addr", f"http://127.0.0.1:{meta_port}"]
    query = LakeProcess("query-first", args, addr, tmp_path / "query-first.log").launch()
    processes.append(query)
    # Up and bound, but not serving: no catalog yet.
    until(lambda: health(query) is not None, 60, "answering gRPC Health")
    assert health(query) == health_pb2.HealthCheckResponse.NOT_SERVING
    # A statement is refused at once, retryably, with the reason (not a 10 s wait).
    asked = time.monotonic()
    with pytest.raises(flight.FlightUnavailableError, match="no catalog yet"):
        select(query, "SELECT 1 AS one")
    assert time.monotonic() - asked < 2.0
    time.sleep(1.0)  # still waiting, still up
    assert query.proc is not None
    assert query.proc.poll() is None, query.log()[-3000:]
    assert health(query) == health_pb2.HealthCheckResponse.NOT_SERVING
    # Metasrv starts: the replica serves about a second after it answers.
    meta = start_meta(tmp_path / "data", tmp_path, port=meta_port)
    processes.append(meta)
    answered = time.monotonic()
    serving = until(lambda: health(query) == health_pb2.HealthCheckResponse.SERVING, 60, "SERVING")
    assert serving - answered < SERVES_WITHIN_S, f"served {serving - answered:.2f}s later"
    assert select(query, "SELECT 1 AS one") == [{"one": 1}]
    asyncio.run(_create(meta, TABLE))
    asyncio.run(_append(query, TABLE, [1, 2, 3]))
    assert select(query, f"SELECT count(*) AS n FROM {TABLE.qualified}") == [{"n": 3}]


def test_query_keeps_serving_reads_through_a_metasrv_restart(
    tmp_path: Path, processes: list[LakeProcess]
) -> None:
    meta = start_meta(tmp_path / "data", tmp_path)
    processes.append(meta)
    query = start_query(meta.addr, tmp_path)
    processes.append(query)
    asyncio.run(_create(meta, TABLE))
    asyncio.run(_append(query, TABLE, [1, 2]))
    count = f"SELECT count(*) AS n FROM {TABLE.qualified}"
    until(lambda: select(query, count) == [{"n": 2}], 30, "the append visible")
    meta.stop()
    # Reads plan from the catalog the replica holds; a forwarded append fails
    # retryably (its outcome unknown to the client: the SDK retries it by operation id).
    assert health(query) == health_pb2.HealthCheckResponse.SERVING
    assert select(query, count) == [{"n": 2}]
    with pytest.raises(CommitStateUnknown, match="metadata service unavailable") as refused:
        asyncio.run(_append(query, TABLE, [3]))
    assert refused.value.retryable
    # Metasrv back on the same address: appends and new tables work again.
    meta.start()
    back = time.monotonic()
    until(lambda: _appended(query, [3]), 30, "appending again")
    assert select(query, count) == [{"n": 3}]
    other = TableRef("robots", "after_restart")
    asyncio.run(_create(meta, other))
    until(
        lambda: select(query, f"SELECT count(*) AS n FROM {other.qualified}") == [{"n": 0}],
        30,
        "the new table visible",
    )
    assert query.proc is not None
    assert query.proc.poll() is None
    assert time.monotonic() - back < 30


def _appended(query: LakeProcess, ids: list[int]) -> bool:
    try:
        asyncio.run(_append(query, TABLE, ids))
    except LakeError as exc:  # retryable while Metasrv is coming back
        if not exc.retryable:
            raise
        return False
    return True
