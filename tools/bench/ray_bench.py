"""Ray Data reads of Lake (``lake_sdk.ray.read_lake``) against the SDK's own sharded scan.

- ``ray_read``: ``read_lake`` of ``SELECT * FROM bench.ray_rows`` (4 numeric
  columns; 4 M rows full, 200,000 quick) consumed with
  ``iter_batches(batch_format="pyarrow", batch_size=65536)``, against the
  SDK's ``Client.scan`` of the same statement reading every endpoint in one
  process. Goal >= 0.5 of the scan's rows/s. Query makes one endpoint per
  CPU of the local Ray (``LAKE_QUERY_MAX_ENDPOINTS=2``, as docs/training.md
  advises), and the read tasks reserve no CPU, at most two at once
  (``num_cpus=0, concurrency=2``, docs/training.md's advice for read tasks,
  which mostly wait on Query: they start together instead of one at a time
  in an execution's first second). Both sides plan the statement and read
  all its endpoints from one replica; Ray's side also builds the dataset,
  schedules one read task per endpoint on a local Ray (2 CPUs), moves each
  block through Ray's object store and slices it into 65,536-row batches.
  docs/training.md ("Ray Data") says where that overhead goes on two cores.

The local Ray is started once, before the first pair, and stopped at the end
(its start is not timed: a training job pays it once).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import lake_sdk
from lake_core.config import COMPACTION, QUERY_MAX_ENDPOINTS, QUERY_MIN_ENDPOINT_ROWS
from lake_core.names import TableRef
from tools.bench.harness import Figure, at_least, measure, pairs_for, warmup_for
from tools.lake_testing.data import bulk_load
from tools.lake_testing.ray_local import local_ray
from tools.lake_testing.servers import start_meta, start_query

TABLE = TableRef("bench", "ray_rows")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("a", pa.float64()), ("b", pa.float64()), ("c", pa.int64())]
)
SQL = "SELECT * FROM bench.ray_rows"
BATCH_ROWS = 65_536
RAY_CPUS = 2


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


def run(quick: bool) -> list[Figure]:
    rows = 200_000 if quick else 4_000_000
    with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
        root = Path(tmp)
        meta = start_meta(root / "data", root, env={COMPACTION: "off"})
        try:
            bulk_load(meta.addr, TABLE, SCHEMA, rows, _rows, writers=8, timeout_s=600)
            # One endpoint per CPU of the local Ray, as docs/training.md advises
            # (LAKE_QUERY_MAX_ENDPOINTS sized to the workers): both sides read them.
            env = {QUERY_MIN_ENDPOINT_ROWS: "1", QUERY_MAX_ENDPOINTS: str(RAY_CPUS)}
            query = start_query(meta.addr, root, env=env)
            try:
                with local_ray(num_cpus=RAY_CPUS):
                    return [_ray_read(query.url, rows, quick)]
            finally:
                query.stop()
        finally:
            meta.stop()


def _ray_read(url: str, rows: int, quick: bool) -> Figure:
    from lake_sdk.ray import read_lake

    def through_ray() -> float:
        began = time.perf_counter()
        seen = 0
        dataset = read_lake(SQL, url=url, num_cpus=0, concurrency=RAY_CPUS)
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=BATCH_ROWS):
            seen += batch.num_rows
        elapsed = time.perf_counter() - began
        assert seen == rows, f"Ray read {seen} of {rows} rows"
        return rows / elapsed

    def sdk_scan() -> float:
        with lake_sdk.Client(url) as client:
            began = time.perf_counter()
            seen = sum(batch.num_rows for batch in client.scan(SQL))
            elapsed = time.perf_counter() - began
        assert seen == rows, f"the scan read {seen} of {rows} rows"
        return rows / elapsed

    return measure(
        "ray_read",
        through_ray,
        sdk_scan,
        unit="rows/s",
        goal=at_least(0.5, "read_lake >= 0.5x the SDK's sharded scan"),
        pairs=pairs_for(quick),
        warmup=warmup_for(quick),
    )
