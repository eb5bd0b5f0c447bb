"""What verify-on-open (now the default) costs real Query replicas.

One local Metasrv and three Query replicas: ``on`` (default settings, data
files verified before first use), ``off`` (``LAKE_QUERY_VERIFY_ON_OPEN=false``)
and a third that only takes appends, so neither measured replica does a
writer's work. Pairs alternate ``on`` and ``off``, the order rotating.

- ``verify_fleet_read_p50_on_vs_off``: a writer appends 1,000-row batches
  (one new version and data file each) while ADBC readers run the fleet
  workload's reads (``count(*)`` and a filtered aggregate) on one replica;
  a sample is the p50 of each read, summed. Every read on ``on`` whose version
  brought a file it has not verified pays for one digest request to Metasrv
  and the read of that file. Goal: <= 1.05.
- ``verify_cold_first_query_ms``: the replica restarts (not timed), then its
  first point query over a table of several data files (128 MB full size,
  8 MB quick) is timed: with verification it reads and hashes every file
  first. Goal: within the +640 ms bound of ``verify_on_open_first_query_ms``
  (read and hash 128 MB at 200 MB/s), scaled to the data size.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import numpy as np
import pyarrow as pa

import lake_sdk
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tools.bench.harness import Figure, at_most, measure, pairs_for, warmup_for
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

FLEET = TableRef("bench", "verify_fleet")
FLEET_SCHEMA = pa.schema([("writer", pa.int64()), ("row", pa.int64()), ("reward", pa.float64())])
COLD = TableRef("bench", "verify_cold")
COLD_SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float64())])
ROWS_PER_APPEND = 1_000
READS = (
    f"SELECT count(*) AS n FROM {FLEET.qualified}",
    f"SELECT writer, count(*) AS n, sum(reward) AS total FROM {FLEET.qualified} "
    "WHERE row % 10 < 7 GROUP BY writer ORDER BY writer",
)
POINT = f"SELECT x FROM {COLD.qualified} WHERE id = 12345"
OFF = {"LAKE_QUERY_VERIFY_ON_OPEN": "false"}


def _fleet_rows(seq: int) -> pa.RecordBatch:
    rows = np.arange(ROWS_PER_APPEND, dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(ROWS_PER_APPEND, seq % 4, dtype=np.int64)),
            pa.array(rows),
            pa.array(np.random.default_rng(seq).random(ROWS_PER_APPEND)),
        ],
        schema=FLEET_SCHEMA,
    )


def _cold_rows(fragment: int, rows: int) -> pa.RecordBatch:
    ids = np.arange(fragment * rows, (fragment + 1) * rows, dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array(np.random.default_rng(fragment).random(rows))],
        schema=COLD_SCHEMA,
    )


@contextmanager
def _cluster(root: Path) -> Iterator[tuple[LakeProcess, ...]]:
    """Metasrv, then the ``on``, ``off`` and writer replicas."""
    env = {"LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "keys.json"))}
    meta = start_meta(root / "data", root, env=env)
    started: list[LakeProcess] = []
    try:
        for extra in ({}, OFF, OFF):
            started.append(start_query(meta.addr, root, env={**env, **extra}))
        yield meta, *started
    finally:
        for process in started:
            process.stop()
        meta.stop()


def _create(meta: str, table: TableRef, schema: pa.Schema) -> None:
    async def go() -> None:
        async with MetaClient(f"http://{meta}") as admin:
            await admin.create_table(table, schema)

    asyncio.run(go())


class _Writer:
    """Appends a batch every ``pause_s`` until stopped: a new version each time."""

    def __init__(self, replica: LakeProcess, pause_s: float) -> None:
        self._replica = replica
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.appends = 0
        self.error: BaseException | None = None

    def __enter__(self) -> _Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            with lake_sdk.Client(f"grpc://{self._replica.addr}") as client:
                while not self._stop.is_set():
                    client.append_batches(FLEET, [_fleet_rows(self.appends)])
                    self.appends += 1
                    self._stop.wait(self._pause_s)
        except BaseException as exc:  # raised on exit
            self.error = exc


def _reads_p50(connection: Any, reads: int) -> float:
    """The p50 of each of the fleet's reads, summed (one round of both reads at p50).

    Not the p50 of all reads mixed: the two reads take ~15 and ~45 ms, so the
    median of a mixed sample half of each falls in the gap between them and
    jumps with a single read (an A/A run of that statistic spread 0.94-1.16).
    """
    latencies: list[list[float]] = [[] for _ in READS]
    with connection.cursor() as cursor:
        for i in range(reads):
            began = time.perf_counter()
            cursor.execute(READS[i % len(READS)])
            cursor.fetch_arrow_table()
            latencies[i % len(READS)].append((time.perf_counter() - began) * 1000)
    return sum(statistics.median(kind) for kind in latencies)


def _cold_first_query(replica: LakeProcess) -> Callable[[], float]:
    def sample() -> float:
        replica.restart()
        with lake_sdk.Client(f"grpc://{replica.addr}") as client:
            began = time.perf_counter()
            table = client.query_table(POINT)
            elapsed = (time.perf_counter() - began) * 1000
        if table.num_rows != 1:
            raise AssertionError(f"point query returned {table.num_rows} rows")
        return elapsed

    return sample


def run(quick: bool) -> list[Figure]:
    megabytes = 8 if quick else 128
    fragments = 8
    reads = 4 if quick else 20
    with tempfile.TemporaryDirectory() as tmp, _cluster(Path(tmp)) as (meta, on, off, writer):
        _create(meta.addr, FLEET, FLEET_SCHEMA)
        _create(meta.addr, COLD, COLD_SCHEMA)
        rows = megabytes * 1024 * 1024 // 16 // fragments
        with flightsql.connect(f"grpc://{writer.addr}", autocommit=True) as conn:
            for fragment in range(fragments):  # bulk ingests: one commit each
                batch = _cold_rows(fragment, rows)
                step = 128 * 1024  # 2 MB messages: gRPC refuses messages over 16 MiB
                with conn.cursor() as cursor:
                    cursor.adbc_ingest(
                        COLD.name,
                        pa.Table.from_batches([batch.slice(i, step) for i in range(0, rows, step)]),
                        mode="append",
                        db_schema_name=COLD.namespace,
                    )
        with lake_sdk.Client(f"grpc://{writer.addr}") as client:
            client.append_batches(FLEET, [_fleet_rows(0)])

        with (
            flightsql.connect(f"grpc://{on.addr}") as on_conn,
            flightsql.connect(f"grpc://{off.addr}") as off_conn,
            _Writer(writer, pause_s=0.05),
        ):
            fleet = measure(
                "verify_fleet_read_p50_on_vs_off",
                lambda: _reads_p50(on_conn, reads),
                lambda: _reads_p50(off_conn, reads),
                unit="ms",
                goal=at_most(1.05, "fleet reads' p50 with verification <= 1.05x without"),
                pairs=pairs_for(quick),
                warmup=warmup_for(quick),
            )

        budget_ms = megabytes / 200 * 1000
        cold = measure(
            "verify_cold_first_query_ms",
            _cold_first_query(on),
            _cold_first_query(off),
            unit="ms",
            goal=at_most(
                budget_ms,
                f"<= unverified + {budget_ms:.0f} ms (read and hash {megabytes} MB at 200 MB/s)",
                scale="difference",
            ),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
    return [fleet, cold]


if __name__ == "__main__":
    from tools.bench.harness import machine

    print(machine())
    for result in run(quick=False):
        print(result.json())
