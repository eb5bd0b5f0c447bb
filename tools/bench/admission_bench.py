"""Admission control under contention: 16 clients sharing 2 query slots.

One Query replica runs with ``LAKE_QUERY_MAX_CONCURRENT=2`` (and a queue
timeout long enough that nobody is refused). The same workload, a fixed
number of GROUP BY queries, is run by 16 concurrent clients (Lake's figure)
and by 2 (the reference: the limit, no queueing).

- ``admission_throughput_16_vs_2_clients``: aggregate queries/s. Queueing
  must not cost throughput. Goal: >= 0.8x the 2-client figure.
- ``admission_p99_16_vs_p50_2_clients``: p99 latency with 16 clients against
  the 2-client p50. With a fair FIFO each query waits for at most the 14 ahead
  of it, 7 rounds of 2 slots. Goal: <= 8x.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

import lake_sdk
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tools.bench.harness import Figure, alternate, at_least, at_most, figure, pairs_for, warmup_for
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

TABLE = TableRef("bench", "admission")
SCHEMA = pa.schema([("id", pa.int64()), ("a", pa.float64()), ("c", pa.int64())])
APPEND_ROWS = 10_000
SQL = "SELECT c % 64 AS g, count(*) AS n, sum(a) AS s FROM bench.admission GROUP BY c % 64"
LIMIT = 2
MANY, FEW = 16, 2
ENV = {
    "LAKE_QUERY_MAX_CONCURRENT": str(LIMIT),
    "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT": str(MANY),
    "LAKE_QUERY_QUEUE_TIMEOUT_MS": "600000",
}


def _rows(start: int, count: int) -> pa.RecordBatch:
    ids = np.arange(start, start + count, dtype=np.int64)
    values = np.random.default_rng(start).random(count)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array(values), pa.array(ids * 7919 % 1_000_003)], schema=SCHEMA
    )


def _command(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


@contextmanager
def _lake(root: Path, rows: int) -> Iterator[LakeProcess]:
    meta = start_meta(root / "data", root)
    try:
        query = start_query(meta.addr, root, env=ENV)
        try:

            async def create() -> None:
                async with MetaClient(meta.http_url) as admin:
                    await admin.create_table(TABLE, SCHEMA)

            asyncio.run(create())
            with lake_sdk.connect(query.url) as client:
                for start in range(0, rows, APPEND_ROWS):
                    client.append_batches(TABLE, [_rows(start, min(APPEND_ROWS, rows - start))])
            yield query
        finally:
            query.stop()
    finally:
        meta.stop()


@dataclass(frozen=True)
class Run:
    throughput: float  # queries/s, all clients together
    p50_ms: float
    p99_ms: float


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _workload(query: LakeProcess, clients: int, total: int) -> Run:
    """``total`` queries spread over ``clients`` concurrent clients."""
    per_client = total // clients
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start_line = threading.Barrier(clients + 1)

    def client() -> None:
        mine = []
        try:
            with flight.FlightClient(f"grpc+tcp://{query.addr}") as conn:
                start_line.wait()
                for _ in range(per_client):
                    began = time.perf_counter()
                    info = conn.get_flight_info(_command(SQL))
                    result = conn.do_get(info.endpoints[0].ticket).read_all()
                    mine.append((time.perf_counter() - began) * 1000)
                    assert result.num_rows == 64
        except BaseException as exc:  # reported below, after every thread ends
            with lock:
                errors.append(exc)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return Run(
        throughput=len(latencies) / elapsed,
        p50_ms=_percentile(latencies, 0.5),
        p99_ms=_percentile(latencies, 0.99),
    )


def run(quick: bool) -> list[Figure]:
    rows = 300_000 if quick else 1_000_000
    total = 32 if quick else 192  # queries per run, the same for 16 and 2 clients
    many: list[Run] = []
    few: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp, _lake(Path(tmp), rows) as query:

        def lake() -> float:
            many.append(_workload(query, MANY, total))
            return many[-1].throughput

        def reference() -> float:
            few.append(_workload(query, FEW, total))
            return few[-1].throughput

        samples = alternate(
            {"lake": lake, "reference": reference},
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
    kept = len(samples["lake"])
    # The same runs (warm-up dropped) give the latency figure, pair by pair.
    return [
        figure(
            "admission_throughput_16_vs_2_clients",
            samples["lake"],
            samples["reference"],
            unit="queries/s",
            goal=at_least(0.8, f">= 0.8x the {FEW}-client throughput at a limit of {LIMIT}"),
            load_1m=samples.load_1m,
        ),
        figure(
            "admission_p99_16_vs_p50_2_clients",
            [r.p99_ms for r in many[-kept:]],
            [r.p50_ms for r in few[-kept:]],
            unit="ms",
            goal=at_most(
                8.0, f"{MANY}-client p99 <= 8x the {FEW}-client p50 at a limit of {LIMIT}"
            ),
            load_1m=samples.load_1m,
        ),
    ]
