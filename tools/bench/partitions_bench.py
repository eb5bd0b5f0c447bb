"""Partitioned results: two partitions of one scan read in parallel against one stream.

- ``partitioned_scan``: ``SELECT * FROM bench.partitioned`` (4 numeric columns)
  read as the two endpoints a replica with ``LAKE_QUERY_MAX_ENDPOINTS=2``
  returns, each DoGet on its own thread and connection, against the same
  result as the single stream of a replica with ``LAKE_QUERY_MAX_ENDPOINTS=1``.
  Both replicas serve the same pinned version from one Metasrv. Report only
  (no goal): the ratio is parallel time over single-stream time, and what
  bounds it is the machine's cores. Each stream spends its time in Lance
  decoding and IPC encoding on the server and in decoding on the client, so
  two streams need about two server cores plus client CPU; on a 2-core
  machine the client and the server share the same two cores and the ratio
  cannot fall far below 1.

The full run loads 4 M rows and compacts them (about one fragment per
million rows, as an operator's table would be); the quick run loads 200,000
rows and leaves one fragment per append.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

from lake_core.config import COMPACTION, QUERY_MAX_ENDPOINTS, QUERY_MIN_ENDPOINT_ROWS
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tools.bench.harness import Figure, measure, pairs_for, timed, warmup_for
from tools.lake_testing.data import bulk_load
from tools.lake_testing.servers import start_meta, start_query

TABLE = TableRef("bench", "partitioned")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("a", pa.float64()), ("b", pa.float64()), ("c", pa.int64())]
)
SQL = "SELECT * FROM bench.partitioned"
WRITERS = 8


def _rows(start: int, count: int) -> pa.RecordBatch:
    ids = np.arange(start, start + count, dtype=np.int64)
    rng = np.random.default_rng(start)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids),
            pa.array(rng.random(count)),
            pa.array(rng.random(count)),
            pa.array(ids % 7),
        ],
        schema=SCHEMA,
    )


def _load(meta_addr: str, rows: int, compact: bool) -> None:
    bulk_load(meta_addr, TABLE, SCHEMA, rows, _rows, writers=WRITERS, timeout_s=600)
    if compact:
        asyncio.run(_compact(meta_addr))


async def _compact(meta_addr: str) -> None:
    async with MetaClient(f"http://{meta_addr}", timeout_s=600) as client:
        result = await client.optimize_table(TABLE)
    print(
        f"# bench.partitioned: fragments {result.fragments_before} -> {result.fragments_after}",
        file=sys.stderr,
        flush=True,
    )


def _command(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def run(quick: bool) -> list[Figure]:
    rows = 200_000 if quick else 4_000_000
    with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
        root = Path(tmp)
        meta = start_meta(root / "data", root, env={COMPACTION: "off"})
        try:
            _load(meta.addr, rows, compact=not quick)
            split = start_query(
                meta.addr, root, env={QUERY_MAX_ENDPOINTS: "2", QUERY_MIN_ENDPOINT_ROWS: "1"}
            )
            whole = start_query(meta.addr, root, env={QUERY_MAX_ENDPOINTS: "1"})
            try:
                return [
                    _partitioned_scan(
                        f"grpc+tcp://{split.addr}", f"grpc+tcp://{whole.addr}", rows, quick
                    )
                ]
            finally:
                split.stop()
                whole.stop()
        finally:
            meta.stop()


def _partitioned_scan(split: str, whole: str, rows: int, quick: bool) -> Figure:
    pool = ThreadPoolExecutor(2)

    def parallel() -> float:
        # One connection per partition, opened before the clock starts, as
        # the single stream's connection is.
        clients = [flight.FlightClient(split) for _ in range(2)]
        try:
            info = clients[0].get_flight_info(_command(SQL))
            assert len(info.endpoints) == 2
            began = time.perf_counter()
            tables = list(
                pool.map(
                    lambda pair: pair[0].do_get(pair[1].ticket).read_all(),
                    zip(clients, info.endpoints, strict=True),
                )
            )
            elapsed = time.perf_counter() - began
        finally:
            for client in clients:
                client.close()
        assert sum(t.num_rows for t in tables) == rows
        return elapsed

    def single() -> float:
        with flight.FlightClient(whole) as client:
            info = client.get_flight_info(_command(SQL))
            assert len(info.endpoints) == 1
            return timed(lambda: client.do_get(info.endpoints[0].ticket).read_all())

    try:
        return measure(
            "partitioned_scan",
            parallel,
            single,
            unit="s",
            goal=None,
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
    finally:
        pool.shutdown()
