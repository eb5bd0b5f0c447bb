"""A job that meets a transient shortage is retried, not failed: real replica, real clients.

Tenant globex holds most of the replica's query memory
(``LAKE_QUERY_MEMORY_LIMIT_BYTES``) with DoGets it never reads. Tenant acme's
async job, one aggregate that needs ~40 MB at once (no group to spill), is
picked up meanwhile: the busy replica gives it only a small pool, it runs out
of it and is refused RESOURCE_EXHAUSTED (the replica was busy, retryable).
The job stays pending/running, retried with backoff within its execution
timeout, and completes once globex lets go.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

from lake_core.config import (
    QUERY_MEMORY_LIMIT_BYTES,
    QUERY_MEMORY_POOLS_PER_TENANT,
    QUERY_STALL_TIMEOUT_MS,
)
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2 as sql_pb
from tests.async_queries.conftest import TOKENS, AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished
from tools.lake_testing.data import create_table
from tools.lake_testing.servers import LakeProcess

WIDE = TableRef("robots", "wide")
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.utf8())])
#: ~160 MB computed by DataFusion (a pool each), more than a client's window takes unread.
HOLD_SQL = f"SELECT id, payload || payload || payload || payload AS payload FROM {WIDE.qualified}"
#: Needs every payload in memory at once (~40 MB: one group, nothing to spill).
JOB_SQL = f"SELECT cardinality(array_agg(payload)) AS n FROM {WIDE.qualified}"


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def retries(replica: LakeProcess) -> int:
    return sum(
        1
        for line in replica.log().splitlines()
        if line.startswith("{") and json.loads(line).get("event") == "async job retrying"
    )


def test_a_job_meeting_a_full_memory_pool_completes_once_it_frees(async_lake: AsyncLake) -> None:
    replica = async_lake.add_query(
        {
            QUERY_MEMORY_LIMIT_BYTES: str(1 << 30),
            QUERY_MEMORY_POOLS_PER_TENANT: "4",  # one tenant may hold most of the replica
            QUERY_STALL_TIMEOUT_MS: "600000",  # the holder lets go when the test says
        }
    )
    create_table(async_lake.meta.addr, WIDE, SCHEMA)
    with client(replica) as sdk:
        for start in range(0, 40_000, 10_000):
            ids = list(range(start, start + 10_000))
            payload = ["y" * 1_000 + f"{i:08d}" for i in ids]
            sdk.append_batches(WIDE, [pa.RecordBatch.from_pydict({"id": ids, "payload": payload})])
    options = flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {TOKENS['globex']}".encode())], timeout=60
    )
    held: list[tuple[flight.FlightClient, flight.FlightStreamReader]] = []
    try:
        for _ in range(4):
            holder = flight.connect(replica.url)  # default channel: BDP probing on
            info = holder.get_flight_info(statement(HOLD_SQL), options)
            held.append((holder, holder.do_get(info.endpoints[0].ticket, options)))
        with client(replica) as sdk:
            handle = sdk.jobs.submit(JOB_SQL)
            # Picked up, out of the small pool a busy replica gives, retried, not failed.
            deadline = time.monotonic() + 60
            while retries(replica) < 2:
                assert time.monotonic() < deadline, replica.log()[-3000:]
                assert sdk.jobs.poll(handle).state in ("pending", "running")
                time.sleep(0.05)
            assert sdk.jobs.poll(handle).state in ("pending", "running")
            # globex lets go: the job completes.
            for holder, reader in held:
                reader.cancel()
                holder.close()
            held.clear()
            finished = wait_finished(sdk, handle)
            assert finished.state == "done", finished
            rows = sdk.jobs.resume(finished).to_table()["n"].to_pylist()
            assert rows == [40_000]
    finally:
        for holder, reader in held:
            reader.cancel()
            holder.close()
