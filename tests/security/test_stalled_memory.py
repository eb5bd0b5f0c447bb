"""Never-read DoGets give the replica's query memory back, and one tenant holds its share only.

A ~160 MB result computed by DataFusion takes a query memory pool from the
replica's ``LAKE_QUERY_MEMORY_LIMIT_BYTES`` (elastic: a full quarter while
there is room, smaller while other queries hold the memory). Tenant acme
opens eight such DoGets with DEFAULT gRPC clients (BDP probing on, as users
run them) and never reads them. Then:

- every one of them is admitted and gets a pool, and tenant globex's small
  sort gets in at once, twice over: pools leave a floor for every query
  admission may still let in, so memory never refuses an admitted query;
- acme holds at most its share (``LAKE_QUERY_MEMORY_POOLS_PER_TENANT`` full
  pools' worth) while it may, and all of the memory when it is the only one;
- the stall timeout (``LAKE_QUERY_STALL_TIMEOUT_MS``) gives every pool back:
  ``lake_query_memory_reserved_bytes`` is 0 within a second of the last
  stream ended for its stalled client. A stream's stall starts once the
  client's window is full, which with BDP probing on can take a few seconds
  of producing: no earlier bound.

No refusal for memory is counted on the way. Both DoGet paths: grpcio on the
main listener and the native data plane.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from lake_core.config import METRICS_ADDR
from lake_core.names import TableRef
from tests.security.cluster import SecureCluster, bearer, statement
from tests.security.conftest import DOGET_PATHS, sdk
from tests.telemetry.scrape import scrape, value
from tools.lake_testing.servers import LakeProcess, free_port

STALL_TIMEOUT_MS = 3_000
#: Four pools of 256 MiB (room for the concatenations of BIG_SQL).
MEMORY_LIMIT = 1024 * 1024 * 1024
BIG = TableRef("acme_ops", "stalled_memory")
SMALL = TableRef("globex_ops", "stalled_memory")
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.utf8())])
ROWS_PER_APPEND = 10_000
APPENDS = 4
#: Run by DataFusion (a computed column: not a direct scan), so it takes a pool, and
#: streamed as it is read, so its messages wait for the client at once. ~160 MB: more
#: than a default client's receive window grows to take in unread (BDP probing).
BIG_SQL = f"SELECT id, payload || payload || payload || payload AS payload FROM {BIG.qualified}"
SMALL_SQL = f"SELECT id FROM {SMALL.qualified} ORDER BY id DESC"
FAILURES = (flight.FlightError, pa.ArrowException)


def batch(start: int, rows: int, width: int) -> pa.RecordBatch:
    ids = list(range(start, start + rows))
    payload = ["y" * width + f"{i:08d}" for i in ids]
    return pa.RecordBatch.from_pydict({"id": ids, "payload": payload}, schema=SCHEMA)


@pytest.fixture(scope="module")
def tables(secure: SecureCluster) -> None:
    secure.admin_call(lambda c: c.create_table(BIG, SCHEMA))
    secure.admin_call(lambda c: c.create_table(SMALL, SCHEMA))
    with sdk(secure, "alice") as alice:
        for i in range(APPENDS):
            alice.append_batches(BIG, [batch(i * ROWS_PER_APPEND, ROWS_PER_APPEND, 1_000)])
    with sdk(secure, "bob") as bob:
        bob.append_batches(SMALL, [batch(0, 10, 8)])


@dataclass
class Replica:
    process: LakeProcess
    metrics_port: int

    def refused(self, gate: str) -> float:
        return value(scrape(self.metrics_port), "lake_query_admission_refused_total", gate=gate)


def start_replica(secure: SecureCluster, path: str, name: str, pools: int) -> Replica:
    port = free_port()
    env = {
        "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT": "8",
        "LAKE_QUERY_QUEUE_TIMEOUT_MS": "100",
        "LAKE_QUERY_STALL_TIMEOUT_MS": str(STALL_TIMEOUT_MS),
        "LAKE_QUERY_MEMORY_LIMIT_BYTES": str(MEMORY_LIMIT),
        "LAKE_QUERY_MEMORY_POOLS_PER_TENANT": str(pools),
        METRICS_ADDR: f"127.0.0.1:{port}",
    }
    return Replica(secure.add_serving(path, name, env), port)


@pytest.fixture(params=DOGET_PATHS)
def path(request: pytest.FixtureRequest, tables: None) -> str:
    return str(request.param)


@dataclass
class Held:
    """DoGets a client opened and never reads, and the refusals it met opening them."""

    streams: list[tuple[flight.FlightClient, flight.FlightStreamReader]] = field(
        default_factory=list
    )
    refusals: list[str] = field(default_factory=list)
    last_opened: float = 0.0

    def close(self) -> None:
        for client, reader in self.streams:
            reader.cancel()
            client.close()


def ticket(secure: SecureCluster, replica: LakeProcess, user: str, sql: str) -> flight.Ticket:
    with secure.flight(replica) as planner:
        info = planner.get_flight_info(statement(sql), bearer(secure.tokens[user]))
    return info.endpoints[0].ticket


def hold(secure: SecureCluster, replica: LakeProcess, count: int) -> Held:
    """``count`` DoGets of BIG by alice, opened with default clients and never read."""
    held = Held()
    for _ in range(count):
        found = ticket(secure, replica, "alice", BIG_SQL)
        client = secure.doget(replica)  # default channel arguments: BDP probing on
        try:
            held.streams.append((client, client.do_get(found, bearer(secure.tokens["alice"]))))
            held.last_opened = time.monotonic()
        except FAILURES as exc:
            held.refusals.append(str(exc))
            client.close()
    return held


def run(secure: SecureCluster, replica: LakeProcess, user: str, sql: str) -> str | None:
    """None if ``user``'s ``sql`` ran to its end, else the refusal."""
    client = secure.doget(replica)
    try:
        reader = client.do_get(ticket(secure, replica, user, sql), bearer(secure.tokens[user]))
        reader.read_all()
    except FAILURES as exc:
        return str(exc)
    finally:
        client.close()
    return None


def stall_times(replica: LakeProcess) -> list[float]:
    """When ``replica`` ended a stream for its stalled client (epoch seconds, its log)."""
    times = []
    for line in replica.log().splitlines():
        if line.startswith("{") and '"query client stalled"' in line:
            stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
            times.append(datetime.fromisoformat(stamp).timestamp())
    return times


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        yield started
    finally:
        for replica in started:
            replica.process.stop()


def reserved(replica: Replica) -> float:
    return value(scrape(replica.metrics_port), "lake_query_memory_reserved_bytes")


def test_stalled_streams_give_the_memory_back(
    secure: SecureCluster, path: str, replicas: list[Replica]
) -> None:
    """One tenant may fill the memory; others still run; the stall timeout frees it all."""
    replica = start_replica(secure, path, "stalled-memory-all", pools=4)
    replicas.append(replica)
    held = hold(secure, replica.process, 8)
    try:
        assert len(held.streams) == 8, held.refusals
        holding = reserved(replica)
        assert holding >= MEMORY_LIMIT // 2, holding  # acme's pools hold most of it
        # Another tenant's small sort gets in at once, twice over ...
        assert run(secure, replica.process, "bob", SMALL_SQL) is None
        assert run(secure, replica.process, "bob", SMALL_SQL) is None
        # ... and every pool is back within a second of the last stall.
        while (now := reserved(replica)) > 0:
            assert time.monotonic() < held.last_opened + 60, f"{now:.0f} bytes still held"
            time.sleep(0.05)
        released = time.time()
        stalls = stall_times(replica.process)
        assert len(stalls) == 8, stalls
        assert released <= max(stalls) + 1.0, f"released {released - max(stalls):.2f}s after"
        assert replica.refused("memory") == 0
        assert replica.refused("tenant_memory") == 0
    finally:
        held.close()


def test_one_tenant_holds_only_its_share_of_the_memory(
    secure: SecureCluster, path: str, replicas: list[Replica]
) -> None:
    """With two pools per tenant, acme's held streams hold half the memory at most."""
    replica = start_replica(secure, path, "stalled-memory-share", pools=2)
    replicas.append(replica)
    held = hold(secure, replica.process, 8)
    try:
        assert len(held.streams) == 8, held.refusals
        assert 0 < reserved(replica) <= 2 * (MEMORY_LIMIT // 4)
        # Before any stall: the other tenant runs at once, twice over ...
        assert run(secure, replica.process, "bob", SMALL_SQL) is None
        assert run(secure, replica.process, "bob", SMALL_SQL) is None
        assert time.monotonic() - held.last_opened < STALL_TIMEOUT_MS / 1000
        assert replica.refused("tenant_memory") == 0
        assert replica.refused("memory") == 0
    finally:
        held.close()
