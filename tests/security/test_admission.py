"""Admission control on a real Query replica: 2 running, 8 per tenant, 100 ms queue.

Results are ~20 MB, larger than everything gRPC and Query buffer while the
client's receive window stays at its default (``NEVER_READING``), so a client
that stops reading keeps its query running: the tests control exactly how
long each permit is held. Every test runs on both DoGet paths: grpcio, and the
native data plane (``limited`` is a replica of each kind).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from lake_core.names import TableRef
from tests.security.cluster import (
    SecureCluster,
    bearer,
    on_data_plane,
    statement,
)
from tests.security.conftest import DOGET_PATHS, sdk
from tools.lake_testing.dataplane import NEVER_READING
from tools.lake_testing.servers import LakeProcess

QUEUE_TIMEOUT_MS = 100
EXECUTION_TIMEOUT_MS = 4_000
LIMITS = {
    "LAKE_QUERY_MAX_CONCURRENT": "2",
    "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT": "8",
    "LAKE_QUERY_QUEUE_TIMEOUT_MS": str(QUEUE_TIMEOUT_MS),
    "LAKE_QUERY_EXECUTION_TIMEOUT_MS": str(EXECUTION_TIMEOUT_MS),
}
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.utf8())])
ROWS_PER_APPEND = 10_000
APPENDS = 2
ROWS = ROWS_PER_APPEND * APPENDS
EXPECTED_ID_SUM = ROWS * (ROWS - 1) // 2
BIG = {"acme": TableRef("acme_ops", "big"), "globex": TableRef("globex_ops", "big")}
USERS = {"alice": "acme", "amy": "acme", "bob": "globex"}
FAILURES = (flight.FlightError, pa.ArrowException)


def big_batch(start: int) -> pa.RecordBatch:
    ids = list(range(start, start + ROWS_PER_APPEND))
    payload = ["x" * 1_000 + f"{i:08d}" for i in ids]
    return pa.RecordBatch.from_pydict({"id": ids, "payload": payload}, schema=SCHEMA)


@pytest.fixture(scope="module")
def tables(secure: SecureCluster) -> None:
    for tenant, table in BIG.items():
        secure.admin_call(lambda c, t=table: c.create_table(t, SCHEMA))
        user = "alice" if tenant == "acme" else "bob"
        with sdk(secure, user) as client:
            for i in range(APPENDS):
                client.append_batches(table, [big_batch(i * ROWS_PER_APPEND)])


@pytest.fixture(scope="module", params=DOGET_PATHS)
def limited(
    secure: SecureCluster, tables: None, request: pytest.FixtureRequest
) -> Iterator[LakeProcess]:
    replica = secure.add_serving(request.param, "limited", LIMITS)
    try:
        yield replica
    finally:
        replica.stop()


def sql(user: str) -> str:
    return f"SELECT id, payload FROM {BIG[USERS[user]].qualified}"


class Holder:
    """A DoGet stream that has received its first batch and then stops reading."""

    def __init__(self, secure: SecureCluster, replica: LakeProcess, user: str) -> None:
        options = bearer(secure.tokens[user])
        with secure.flight(replica) as planner:
            info = planner.get_flight_info(statement(sql(user)), options)
        self.client = secure.doget(replica, options=NEVER_READING)
        self.reader = self.client.do_get(info.endpoints[0].ticket, options)
        first = self.reader.read_chunk().data
        self.rows, self.id_sum = first.num_rows, sum(first.column("id").to_pylist())

    def finish(self) -> None:
        for chunk in self.reader:
            self.rows += chunk.data.num_rows
            self.id_sum += sum(chunk.data.column("id").to_pylist())
        self.client.close()
        assert (self.rows, self.id_sum) == (ROWS, EXPECTED_ID_SUM)

    def drop(self) -> None:
        self.reader.cancel()
        self.client.close()


def admitted_at_once(secure: SecureCluster, replica: LakeProcess, user: str = "bob") -> Holder:
    start = time.monotonic()
    holder = Holder(secure, replica, user)
    assert time.monotonic() - start < 5
    return holder


def exhausted(secure: SecureCluster, replica: LakeProcess, user: str) -> float:
    """Seconds from DoGet to RESOURCE_EXHAUSTED, with no data received."""
    options = bearer(secure.tokens[user])
    with secure.flight(replica) as planner:
        info = planner.get_flight_info(statement(sql(user)), options)
    with secure.doget(replica) as client:
        start = time.monotonic()
        try:
            client.do_get(info.endpoints[0].ticket, options).read_chunk()
        except FAILURES as exc:
            error = str(exc)
        else:
            raise AssertionError("a query was admitted beyond the limits")
    assert is_exhausted(error), error
    return time.monotonic() - start


def is_exhausted(error: str) -> bool:
    # pyarrow raises ArrowInvalid("gRPC returned resource exhausted error ...") on the
    # grpcio path; pyarrow's server cannot send RESOURCE_EXHAUSTED, so the data plane
    # answers a full queue with UNAVAILABLE, which says "retry" to every client.
    return "returned resource exhausted error" in error or (
        "UNAVAILABLE:" in error and "retry later" in error
    )


def admission_log(replica: LakeProcess) -> list[dict[str, object]]:
    events = []
    for line in replica.log().splitlines():
        if line.startswith("{") and '"query ' in line:
            event = json.loads(line)
            if event.get("event") in ("query admitted", "query refused"):
                events.append(event)
    return events


@dataclass
class Outcome:
    user: str
    ok: bool = False
    rows: int = 0
    id_sum: int = 0
    refused_after_s: float | None = None
    error: str | None = None


def test_a_storm_of_32_clients(secure: SecureCluster, limited: LakeProcess) -> None:
    users = ["alice", "amy"] * 12 + ["bob"] * 8
    outcomes = [Outcome(user) for user in users]
    planned = threading.Barrier(len(users))

    def client(outcome: Outcome) -> None:
        options = bearer(secure.tokens[outcome.user])
        with secure.flight(limited) as flight_client, secure.doget(limited) as data:
            try:
                info = flight_client.get_flight_info(statement(sql(outcome.user)), options)
            finally:
                planned.wait(60)  # every client asks DoGet at the same moment
            start = time.monotonic()
            try:
                reader = data.do_get(info.endpoints[0].ticket, options)
                first = reader.read_chunk().data
            except FAILURES as exc:
                outcome.refused_after_s = time.monotonic() - start
                outcome.error = str(exc)
                return
            time.sleep(0.5)  # hold the permit well past everyone's queue deadline
            batches = [first] + [chunk.data for chunk in reader]
            outcome.rows = sum(b.num_rows for b in batches)
            outcome.id_sum = sum(sum(b.column("id").to_pylist()) for b in batches)
            outcome.ok = True

    log_start = len(admission_log(limited))
    threads = [threading.Thread(target=client, args=(o,)) for o in outcomes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    admitted = [o for o in outcomes if o.ok]
    refused = [o for o in outcomes if not o.ok]
    assert len(admitted) >= 2
    assert len(refused) >= 16, [o.error for o in refused]
    for outcome in admitted:
        assert (outcome.rows, outcome.id_sum) == (ROWS, EXPECTED_ID_SUM)
    for outcome in refused:
        assert outcome.error is not None
        assert is_exhausted(outcome.error), outcome.error
        assert outcome.refused_after_s is not None
        # The queue timeout is 100 ms; the rest is client threads on a busy machine.
        assert outcome.refused_after_s < QUEUE_TIMEOUT_MS / 1000 + 2.0

    events = admission_log(limited)[log_start:]
    admissions = [e for e in events if e["event"] == "query admitted"]
    refusals = [e for e in events if e["event"] == "query refused"]
    assert len(admissions) == len(admitted)
    assert len(refusals) == len(refused)
    assert max(int(str(e["running"])) for e in admissions) <= 2
    # Server side, refusals came at the one queue deadline (plus event-loop lag on a
    # busy machine), well before any admitted client let go of its slot (>= 500 ms).
    waits = [float(str(e["waited_ms"])) for e in refusals]
    assert min(waits) >= QUEUE_TIMEOUT_MS - 1
    assert max(waits) < QUEUE_TIMEOUT_MS + 250

    # Every permit came back: both slots are free for new queries at once.
    first, second = admitted_at_once(secure, limited), admitted_at_once(secure, limited, "alice")
    first.finish()
    second.finish()


def test_a_client_dropping_its_stream_releases_its_permit(
    secure: SecureCluster, limited: LakeProcess
) -> None:
    dropper = admitted_at_once(secure, limited, "alice")
    keeper = admitted_at_once(secure, limited, "bob")
    exhausted(secure, limited, "amy")  # both slots are held

    dropper.drop()
    deadline = time.monotonic() + 10
    replacement = None
    while replacement is None:
        try:
            replacement = Holder(secure, limited, "amy")
        except FAILURES as exc:
            error = str(exc)
        else:
            break
        assert is_exhausted(error), error
        assert time.monotonic() < deadline, "the dropped stream's permit was never released"
        time.sleep(0.05)
    exhausted(secure, limited, "alice")  # the keeper still holds the other slot
    replacement.finish()
    keeper.finish()


def test_execution_timeout_ends_the_stream_and_frees_the_slot(
    secure: SecureCluster, limited: LakeProcess
) -> None:
    stalled = admitted_at_once(secure, limited, "alice")
    other = admitted_at_once(secure, limited, "bob")
    other.finish()
    time.sleep(EXECUTION_TIMEOUT_MS / 1000 + 0.5)
    # Both slots are free again although the stalled client never read on.
    first, second = admitted_at_once(secure, limited), admitted_at_once(secure, limited, "amy")
    if on_data_plane(limited):
        # A write blocked in pyarrow's C++ server ends only with its connection
        # (lake_query.dataplane.sockets): the client reads what arrived, then UNAVAILABLE.
        with pytest.raises(flight.FlightUnavailableError, match="Socket closed"):
            stalled.finish()
    else:
        with pytest.raises(flight.FlightTimedOutError, match="execution timeout"):
            stalled.finish()
    stalled.client.close()
    first.finish()
    second.finish()


def test_sql_longer_than_the_limit_is_refused(secure: SecureCluster) -> None:
    options = bearer(secure.tokens["alice"])
    padding = " " * (1024 * 1024)
    with (
        secure.flight() as client,
        pytest.raises(pa.ArrowInvalid, match="SQL text exceeds 1048576 bytes"),
    ):
        client.get_flight_info(statement("SELECT 1" + padding), options)


@pytest.mark.parametrize(
    "sql", ["SELECT '\0' AS a", 'SELECT 1 AS "a\0b"', "SELECT 1 WHERE 'x' <> '\0'"]
)
def test_sql_holding_a_nul_is_refused_as_the_callers_input(secure: SecureCluster, sql: str) -> None:
    """A NUL made DataFusion panic converting the result schema: an Internal error before."""
    options = bearer(secure.tokens["alice"])
    with (
        secure.flight() as client,
        pytest.raises(pa.ArrowInvalid, match="SQL text holds a NUL character"),
    ):
        client.get_flight_info(statement(sql), options)
