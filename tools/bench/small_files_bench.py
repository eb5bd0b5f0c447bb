"""Scans stay fast after many small appends: the background compactor's benchmark.

- ``scan_after_small_appends``: rows/s of a full scan (``SELECT *``) through
  Lake Query of a table built by 10,000 appends of 10 rows each, with
  Metasrv's background compactor running as configured by default
  (``LAKE_COMPACTION=on``), against the same scan of a table holding the
  same 100,000 rows written in one go: 10,000-row appends, the most one
  append takes (``MAX_APPEND_ROWS``), so ten large fragments. Same Lake, same
  run, alternating. Goal: >= 0.8 (issue 31, item 4).

Before measuring, the run waits (bounded) until the compactor has brought
the small table under its threshold of small fragments, then for Query's
catalog refresh; the fragment counts of both tables are printed. Quick mode:
300 appends (3,000 rows), a smoke run.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.config import QUERY_MAX_ENDPOINTS
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_metasrv.maintenance import CompactionSettings
from tools.bench.harness import Figure, at_least, measure, pairs_for, warmup_for
from tools.lake_testing.data import bulk_load
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

SMALL = TableRef("bench", "small")
BULK = TableRef("bench", "bulk")
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("robot", pa.utf8()),
        pa.field("reward", pa.float64()),
        pa.field("note", pa.utf8()),
    ]
)
ROWS_PER_APPEND = 10
WRITERS = 16


def _rows(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"robot-{i % 97}" for i in ids]),
            pa.array([i * 0.25 for i in ids], pa.float64()),
            pa.array([f"step {i} of an episode, padded to a realistic width" for i in ids]),
        ],
        schema=SCHEMA,
    )


def _command(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


@contextmanager
def _lake(root: Path) -> Iterator[tuple[LakeProcess, LakeProcess]]:
    meta = start_meta(root / "data", root)  # LAKE_COMPACTION on: the default
    try:
        query = start_query(meta.addr, root, env={QUERY_MAX_ENDPOINTS: "1"})
        try:
            yield meta, query
        finally:
            query.stop()
    finally:
        meta.stop()


def _small_appends(meta: LakeProcess, appends: int) -> None:
    async def load() -> None:
        async with MetaClient(f"http://{meta.addr}", timeout_s=300) as client:
            await client.create_table(SMALL, SCHEMA)
            starts = list(range(0, appends * ROWS_PER_APPEND, ROWS_PER_APPEND))
            starts.reverse()

            async def writer() -> None:
                while starts:
                    start = starts.pop()
                    command = protocol.AppendCommand(table=SMALL, operation_id=new_operation_id())
                    await client.append(command, SCHEMA, [_rows(start, ROWS_PER_APPEND)])

            await asyncio.gather(*(writer() for _ in range(WRITERS)))

    asyncio.run(load())


def _fragments(root: Path, table: TableRef) -> int:
    path = root / "data" / "tables" / table.namespace / f"{table.name}.lance"
    return len(lance.dataset(str(path)).get_fragments())


def _settle(root: Path, timeout_s: float) -> None:
    """Until the compactor took the small table under its threshold (bounded), then a refresh."""
    threshold = CompactionSettings().min_small_fragments
    deadline = time.monotonic() + timeout_s
    while _fragments(root, SMALL) >= threshold and time.monotonic() < deadline:
        time.sleep(1.0)
    time.sleep(2.5)  # > Query's 1 s catalog refresh: both scans read the newest versions


def run(quick: bool) -> list[Figure]:
    appends = 300 if quick else 10_000
    rows = appends * ROWS_PER_APPEND
    with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
        root = Path(tmp)
        with _lake(root) as (meta, query):
            began = time.perf_counter()
            _small_appends(meta, appends)
            print(
                f"# {appends} appends of {ROWS_PER_APPEND} rows in "
                f"{time.perf_counter() - began:.0f} s; fragments {_fragments(root, SMALL)}",
                file=sys.stderr,
                flush=True,
            )
            bulk_load(meta.addr, BULK, SCHEMA, rows, _rows, writers=1)
            _settle(root, 120 if quick else 300)
            print(
                f"# fragments: small {_fragments(root, SMALL)}, bulk {_fragments(root, BULK)}",
                file=sys.stderr,
                flush=True,
            )
            client = flight.FlightClient(f"grpc+tcp://{query.addr}")

            def scan(table: TableRef) -> float:
                began = time.perf_counter()
                info = client.get_flight_info(_command(f"SELECT * FROM {table}"))
                got = client.do_get(info.endpoints[0].ticket).read_all()
                elapsed = time.perf_counter() - began
                assert got.num_rows == rows, (table, got.num_rows, rows)
                return rows / elapsed

            try:
                return [
                    measure(
                        "scan_after_small_appends",
                        lambda: scan(SMALL),
                        lambda: scan(BULK),
                        unit="rows/s",
                        goal=at_least(0.8, ">= 0.8x the same rows written in one go"),
                        pairs=pairs_for(quick),
                        warmup=warmup_for(quick),
                    )
                ]
            finally:
                client.close()
