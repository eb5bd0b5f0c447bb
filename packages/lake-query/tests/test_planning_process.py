"""Planning always ends, against real ``lake query`` processes.

The statements that never finished planning are refused at once, so many
of them leave the replica serving; a planner that is stuck anyway (a
test-only fault point makes every planning slow) gives the caller
DEADLINE_EXCEEDED at ``LAKE_QUERY_PLANNING_TIMEOUT_MS``, one tenant cannot
hold every planning thread, and a replica whose planning threads are all
stuck reports NOT_SERVING on gRPC Health until they end.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from google.protobuf import any_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lake_core.faults import QUERY_PLAN_DELAY_MS
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_grpc
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_query.serving.health import PLANNING_SERVICE
from tools.lake_testing.nesting import HANGS
from tools.lake_testing.servers import LakeProcess, start_meta, start_query
from tools.lake_testing.waiting import until

TOKENS = {"acme": "lk_plan_acme_0001", "globex": "lk_plan_globex_01", "initech": "lk_plan_init_001"}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _principals(path: Path) -> Path:
    bindings = [
        {"token": token, "principal_id": f"{tenant}-user", "tenant_id": tenant, "role": "admin"}
        for tenant, token in TOKENS.items()
    ]
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(0o600)
    return path


class Replica:
    """One ``lake query`` (with its Metasrv), spoken to over gRPC as each tenant."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.meta = start_meta(root / "data", root)
        self.query: LakeProcess | None = None
        full = {"LAKE_AUTH_PRINCIPALS_FILE": str(_principals(root / "principals.json")), **env}
        self.query = start_query(self.meta.addr, root, env=full, probe_token=TOKENS["acme"])
        self.channel = grpc.insecure_channel(self.query.addr)

    def stop(self) -> None:
        self.channel.close()
        if self.query is not None:
            self.query.stop()
        self.meta.stop()

    def plan(self, sql: str, tenant: str = "acme") -> grpc.StatusCode:
        """GetFlightInfo of ``sql``: OK or the status it failed with."""
        wrapper = any_pb2.Any()
        wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
        descriptor = pb.FlightDescriptor(
            type=pb.FlightDescriptor.CMD, cmd=wrapper.SerializeToString()
        )
        stub = flight_grpc.FlightServiceStub(self.channel)
        try:
            stub.GetFlightInfo(descriptor, timeout=60, metadata=self._auth(tenant))
        except grpc.RpcError as exc:
            self.last_error = exc.details() or ""
            return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    def health(self, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        reply = stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=10, metadata=self._auth("acme")
        )
        return reply.status  # type: ignore[no-any-return]

    @staticmethod
    def _auth(tenant: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKENS[tenant]}"),)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    root = tmp_path_factory.mktemp("planning")
    running = Replica(root, {"LAKE_QUERY_PLANNING_TIMEOUT_MS": "5000"})
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def stuck_replica(tmp_path: Path) -> Iterator[Replica]:
    """Two planning threads, one per tenant, and every planning stuck for 4 s."""
    env = {
        "LAKE_FAULTS": f"{QUERY_PLAN_DELAY_MS}=4000",
        "LAKE_QUERY_PLANNING_TIMEOUT_MS": "400",
        "LAKE_QUERY_PLANNING_THREADS": "2",
        "LAKE_QUERY_PLANNING_THREADS_PER_TENANT": "1",
    }
    running = Replica(tmp_path, env)
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("name", sorted(HANGS))
def test_statements_that_never_finished_planning_are_refused_quickly(
    replica: Replica, name: str
) -> None:
    started = time.monotonic()
    assert replica.plan(HANGS[name]) == grpc.StatusCode.INVALID_ARGUMENT
    assert time.monotonic() - started < 5.0
    assert "LAKE_QUERY_MAX_NESTING_DEPTH" in replica.last_error


def test_eight_of_each_leave_the_replica_serving(replica: Replica) -> None:
    statements = [sql for sql in HANGS.values() for _ in range(8)]
    with ThreadPoolExecutor(len(statements)) as pool:
        codes = list(pool.map(replica.plan, statements))
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
    assert replica.plan("SELECT 1") == grpc.StatusCode.OK
    assert replica.health() == SERVING
    assert replica.health(PLANNING_SERVICE) == SERVING


def test_info_logs_name_no_principal_and_no_table(replica: Replica) -> None:
    async def create() -> None:
        async with MetaClient(f"http://{replica.meta.addr}") as meta:
            await meta.create_table(
                TableRef("audit_ns", "secret_table"), pa.schema([("x", pa.int64())])
            )

    asyncio.run(create())
    assert replica.query is not None
    query = replica.query
    until(lambda: replica.plan("SELECT x FROM audit_ns.secret_table") == grpc.StatusCode.OK)
    until(lambda: '"tables": 1' in query.log() or "tables=1" in query.log())
    planned = [line for line in query.log().splitlines() if "query planned" in line]
    assert planned
    for line in planned:
        assert "secret_table" not in line
        assert "acme-user" not in line


def test_a_stuck_planner_times_out_and_all_stuck_is_not_serving(stuck_replica: Replica) -> None:
    replica = stuck_replica
    assert replica.health() == SERVING
    # The first tenant's statement: DEADLINE_EXCEEDED at the planning timeout, not at 4 s.
    started = time.monotonic()
    assert replica.plan("SELECT 1", "acme") == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3.0
    assert "LAKE_QUERY_PLANNING_TIMEOUT_MS" in replica.last_error
    # Its stuck thread is its whole budget: its next statement waits, then is refused.
    assert replica.plan("SELECT 1", "acme") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "LAKE_QUERY_PLANNING_THREADS_PER_TENANT" in replica.last_error
    # One thread is left, for other tenants: still serving.
    assert replica.health() == SERVING
    assert replica.health(PLANNING_SERVICE) == SERVING
    assert replica.plan("SELECT 1", "globex") == grpc.StatusCode.DEADLINE_EXCEEDED
    # Every planning thread is stuck: NOT_SERVING, and statements are refused at once.
    until(lambda: replica.health() == NOT_SERVING)
    assert replica.health(PLANNING_SERVICE) == NOT_SERVING
    started = time.monotonic()
    assert replica.plan("SELECT 1", "initech") == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < 1.0
    # The stuck threads end on their own: the capacity comes back.
    until(lambda: replica.health() == SERVING)
    assert replica.health(PLANNING_SERVICE) == SERVING
