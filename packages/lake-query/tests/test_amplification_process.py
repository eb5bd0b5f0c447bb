"""A real ``lake query`` refuses amplifying concatenations and keeps serving.

The chained-CTE doubling at depth 12 (50 MB doubled twelve times: 200 GB)
and a 400-operand linear chain are sent to a real Query process: each is
refused RESOURCE_EXHAUSTED with the ``QueryTooLarge`` code before it
allocates, the replica stays alive, its peak RSS (VmHWM) stays bounded, and
ordinary concatenations over a real table still answer exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.errors import WANTS_CODES
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_grpc
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from tools.lake_testing.plugin import LakeCluster

from .test_amplification import DOUBLING_12, LINEAR_400, doubling

pytestmark = pytest.mark.slow

MEMORY_LIMIT = 512 * 1024 * 1024
#: Peak RSS allowed: the DataFusion memory plus Python, gRPC and Lance, as in
#: the fuzz test; a doubling that ran would pass it at its fourth level.
HWM_BOUND = MEMORY_LIMIT + 1024 * 1024 * 1024
NAMES = pa.schema([("id", pa.int64()), ("name", pa.utf8())])


def _descriptor(sql: str) -> pb.FlightDescriptor:
    command = any_pb2.Any()
    command.Pack(sql_pb.CommandStatementQuery(query=sql))
    return pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=command.SerializeToString())


def _refusal(addr: str, sql: str) -> tuple[grpc.StatusCode, dict[str, str]]:
    """The status and Lake trailers of planning ``sql`` (OK and {} if accepted)."""
    with grpc.insecure_channel(addr) as channel:
        stub = flight_grpc.FlightServiceStub(channel)
        try:
            stub.GetFlightInfo(_descriptor(sql), timeout=60, metadata=(WANTS_CODES,))
        except grpc.RpcError as exc:
            return exc.code(), dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, {}


def _answer(addr: str, sql: str) -> list[dict[str, object]]:
    client = flight.FlightClient(f"grpc://{addr}")
    try:
        descriptor = flight.FlightDescriptor.for_command(_descriptor(sql).cmd)
        info = client.get_flight_info(descriptor)
        table: pa.Table = client.do_get(info.endpoints[0].ticket).read_all()
        return table.to_pylist()
    finally:
        client.close()


def _hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LakeCluster]:
    env = {"LAKE_QUERY_MEMORY_LIMIT_BYTES": str(MEMORY_LIMIT)}
    lake = LakeCluster.start(tmp_path, env, meta_env={})
    try:
        yield lake
    finally:
        lake.stop()


def test_amplifying_concatenations_are_refused_and_the_replica_keeps_serving(
    cluster: LakeCluster,
) -> None:
    query = cluster.query

    async def fill() -> None:
        async with MetaClient(f"http://{cluster.meta.addr}") as meta:
            await meta.create_table(TableRef("amp", "names"), NAMES)
        async with MetaClient(query.url) as client:
            command = protocol.AppendCommand(
                table=TableRef("amp", "names"), operation_id=new_operation_id()
            )
            batch = pa.record_batch([pa.array(range(50)), [f"n{i}" for i in range(50)]], NAMES)
            await client.append(command, NAMES, [batch])

    asyncio.run(fill())
    stored_doubling = doubling(12, "SELECT name AS s FROM amp.names")
    for sql in (DOUBLING_12, LINEAR_400, stored_doubling):
        code, trailers = _refusal(query.addr, sql)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, sql[:80]
        assert trailers == {"lake-error-code": "QueryTooLarge", "lake-retryable": "false"}
    # Ordinary concatenations, and a doubling that fits the share, answer exactly.
    got = _answer(
        query.addr,
        "SELECT id, name || '-' || cast(id AS varchar) AS k, concat(name, ':', name) AS c, "
        "concat_ws(',', name, 'x') AS w FROM amp.names WHERE id < 3 ORDER BY id",
    )
    assert got == [{"id": i, "k": f"n{i}-{i}", "c": f"n{i}:n{i}", "w": f"n{i},x"} for i in range(3)]
    assert _answer(query.addr, doubling(2, "SELECT repeat('x', 1000000) AS s")) == [
        {"length(c2.s)": 4_000_000}
    ]
    assert _answer(query.addr, "SELECT string_agg(name, '') AS s FROM amp.names") == [
        {"s": "".join(f"n{i}" for i in range(50))}
    ]
    assert query.proc is not None
    assert query.proc.poll() is None, query.log()[-3000:]
    assert _hwm(query.pid) < HWM_BOUND
