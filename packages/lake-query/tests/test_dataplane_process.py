"""The native data plane in a real ``lake query`` process: drain and configuration.

Results are ~20 MB, more than gRPC buffers with the receive window at its
default (``NEVER_READING``), so a client that stops reading keeps its stream
(and its write) blocked in pyarrow's C++ server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.config import QUERY_DATA_ADDR, QUERY_DATA_ADVERTISE, SHUTDOWN_GRACE_MS
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2 as sql_pb
from tools.lake_testing.data import create_table
from tools.lake_testing.dataplane import NEVER_READING
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import LakeProcess, free_port, start_query

pytestmark = pytest.mark.slow

TABLE = TableRef("robots", "payloads")
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.utf8())])
ROWS = 20_000
GRACE_MS = 4_000


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def payloads(start: int, rows: int) -> pa.RecordBatch:
    ids = list(range(start, start + rows))
    return pa.RecordBatch.from_pydict(
        {"id": ids, "payload": ["z" * 1_000 + f"{i:08d}" for i in ids]}, schema=SCHEMA
    )


@pytest.fixture
def replica(lake_cluster: LakeCluster) -> Iterator[LakeProcess]:
    create_table(lake_cluster.meta.addr, TABLE, SCHEMA)
    with lake_sdk.Client(lake_cluster.query.url) as client:
        client.append_batches(TABLE, [payloads(0, ROWS // 2)])
        client.append_batches(TABLE, [payloads(ROWS // 2, ROWS // 2)])
    env = {
        **lake_cluster.env,
        QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}",
        SHUTDOWN_GRACE_MS: str(GRACE_MS),
    }
    process = start_query(lake_cluster.meta.addr, lake_cluster.root, env=env)
    try:
        yield process
    finally:
        process.stop()


class Stream:
    """A data-plane DoGet that has received its first batch."""

    def __init__(self, process: LakeProcess) -> None:
        with flight.FlightClient(f"grpc+tcp://{process.addr}") as planner:
            info = planner.get_flight_info(statement(f"SELECT * FROM {TABLE.qualified}"))
        (location,) = info.endpoints[0].locations
        assert location.uri.decode() == f"grpc+tcp://{process.env[QUERY_DATA_ADDR]}"
        self.ticket = info.endpoints[0].ticket
        self.client = flight.FlightClient(location, generic_options=NEVER_READING)
        self.reader = self.client.do_get(self.ticket)
        self.rows = self.reader.read_chunk().data.num_rows

    def finish(self) -> int:
        while True:
            try:
                self.rows += self.reader.read_chunk().data.num_rows
            except StopIteration:
                return self.rows


def logged(process: LakeProcess, event: str) -> list[dict[str, object]]:
    lines = [line for line in process.log().splitlines() if line.startswith("{")]
    return [e for e in map(json.loads, lines) if e.get("event") == event]


def wait_logged(process: LakeProcess, event: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not logged(process, event):
        assert time.monotonic() < deadline, process.log()[-3000:]
        time.sleep(0.02)


def test_sigterm_lets_a_reading_stream_finish_and_refuses_new_ones(replica: LakeProcess) -> None:
    reading = Stream(replica)
    spare = Stream(replica)  # a second ticket, redeemed only after SIGTERM
    spare.reader.cancel()
    replica.signal(signal.SIGTERM)
    wait_logged(replica, "shutting down (grace 4000 ms)")
    with pytest.raises(flight.FlightUnavailableError, match="shutting down"):
        spare.client.do_get(spare.ticket).read_chunk()
    assert reading.finish() == ROWS
    assert replica.proc is not None
    assert replica.proc.wait(timeout=30) == 0
    assert not logged(replica, "data plane drain cut off streams")


def test_sigterm_cuts_off_a_stalled_stream_at_the_grace(replica: LakeProcess) -> None:
    stalled = Stream(replica)  # never read again
    replica.signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert replica.proc is not None
    # The drain waits out the grace, drops the blocked write, and exits unclean (1).
    assert replica.proc.wait(timeout=GRACE_MS / 1000 + 30) == 1
    assert time.monotonic() - signalled >= GRACE_MS / 1000 - 0.5
    assert logged(replica, "data plane drain cut off streams")
    with pytest.raises(flight.FlightUnavailableError):
        stalled.finish()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({QUERY_DATA_ADDR: "nonsense"}, QUERY_DATA_ADDR),
        ({QUERY_DATA_ADDR: "0.0.0.0:50070"}, QUERY_DATA_ADVERTISE),
        ({QUERY_DATA_ADVERTISE: "127.0.0.1:50070"}, QUERY_DATA_ADDR),
        ({QUERY_DATA_ADDR: "10.1.2.3:50070"}, "requires authentication"),
    ],
)
def test_bad_data_plane_settings_fail_before_binding(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    addr = f"127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "lake_query", "--addr", addr],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 2
    assert named in done.stderr
    assert "listening" not in done.stderr
