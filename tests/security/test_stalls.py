"""Eight never-read DoGets cannot lock their tenant out of a real Query replica.

The tenant may run 8 queries at once; results are ~20 MB, more than gRPC and
Query buffer while the client's receive window stays at its default (see
``NEVER_READING``), so a client that never reads leaves its stream blocked in
a write. At ``LAKE_QUERY_STALL_TIMEOUT_MS`` the replica ends those streams and
releases their permits, and the tenant's next query is admitted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

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

STALL_TIMEOUT_MS = 8_000
LIMITS = {
    "LAKE_QUERY_MAX_CONCURRENT": "64",
    "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT": "8",
    "LAKE_QUERY_QUEUE_TIMEOUT_MS": "100",
    "LAKE_QUERY_STALL_TIMEOUT_MS": str(STALL_TIMEOUT_MS),
}
TABLE = TableRef("acme_ops", "stalls")
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.utf8())])
ROWS_PER_APPEND = 10_000
FAILURES = (flight.FlightError, pa.ArrowException)


def batch(start: int) -> pa.RecordBatch:
    ids = list(range(start, start + ROWS_PER_APPEND))
    payload = ["y" * 1_000 + f"{i:08d}" for i in ids]
    return pa.RecordBatch.from_pydict({"id": ids, "payload": payload}, schema=SCHEMA)


@pytest.fixture(scope="module")
def table(secure: SecureCluster) -> None:
    secure.admin_call(lambda c: c.create_table(TABLE, SCHEMA))
    with sdk(secure, "alice") as client:
        for i in range(2):
            client.append_batches(TABLE, [batch(i * ROWS_PER_APPEND)])


@pytest.fixture(scope="module", params=DOGET_PATHS)
def replica(
    secure: SecureCluster, table: None, request: pytest.FixtureRequest
) -> Iterator[LakeProcess]:
    """A replica with the stall limits, once per DoGet path (grpcio, native data plane)."""
    process = secure.add_serving(request.param, "stalls", LIMITS)
    try:
        yield process
    finally:
        process.stop()


def planned(
    secure: SecureCluster, replica: LakeProcess, user: str
) -> tuple[flight.FlightClient, flight.Ticket]:
    with secure.flight(replica) as planner:
        info = planner.get_flight_info(
            statement(f"SELECT * FROM {TABLE.qualified}"), bearer(secure.tokens[user])
        )
    return secure.doget(replica, options=NEVER_READING), info.endpoints[0].ticket


def refusal(secure: SecureCluster, replica: LakeProcess, user: str) -> str | None:
    """None if ``user``'s query is admitted (and read to its end), else the error."""
    client = secure.doget(replica)
    options = bearer(secure.tokens[user])
    try:
        with secure.flight(replica) as planner:
            info = planner.get_flight_info(statement(f"SELECT * FROM {TABLE.qualified}"), options)
        reader = client.do_get(info.endpoints[0].ticket, options)
        rows = sum(chunk.data.num_rows for chunk in reader)
    except FAILURES as exc:
        return str(exc)
    finally:
        client.close()
    assert rows == 2 * ROWS_PER_APPEND
    return None


def stall_events(replica: LakeProcess) -> int:
    return sum(
        1
        for line in replica.log().splitlines()
        if line.startswith("{") and json.loads(line).get("event") == "query client stalled"
    )


def test_eight_never_read_streams_end_at_the_stall_timeout(
    secure: SecureCluster, replica: LakeProcess
) -> None:
    before = stall_events(replica)
    tickets = [planned(secure, replica, "alice") for _ in range(8)]
    opened = time.monotonic()
    # do_get returns once the schema message arrived: the query holds its permit.
    streams = [(c, c.do_get(t, bearer(secure.tokens["alice"]))) for c, t in tickets]
    assert time.monotonic() - opened < STALL_TIMEOUT_MS / 1000, "opening took too long"
    # The tenant (alice and amy are both acme) is locked out meanwhile ...
    error = refusal(secure, replica, "amy")
    assert error is not None
    # The data plane says UNAVAILABLE (pyarrow cannot send RESOURCE_EXHAUSTED).
    assert "resource exhausted" in error or ("UNAVAILABLE:" in error and "retry later" in error)
    # ... until the stall timeout ends the 8 streams: wait on the replica's own account.
    deadline = opened + STALL_TIMEOUT_MS / 1000 * 1.25 + 30
    while stall_events(replica) - before < 8:
        assert time.monotonic() < deadline, replica.log()[-3000:]
        time.sleep(0.05)
    assert time.monotonic() - opened >= STALL_TIMEOUT_MS / 1000
    assert refusal(secure, replica, "amy") is None
    # Each stalled client finds its stream ended, after what was already buffered:
    # with the status on grpcio; the data plane had to cut the blocked write's connection.
    ended: tuple[type[Exception], str] = (flight.FlightTimedOutError, "took no result message")
    if on_data_plane(replica):
        ended = (flight.FlightUnavailableError, "Socket closed")
    for client, reader in streams:
        with pytest.raises(ended[0], match=ended[1]):
            for _ in reader:
                pass
        client.close()
