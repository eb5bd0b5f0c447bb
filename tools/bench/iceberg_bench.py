"""``iceberg_scan``: federated Iceberg scans through Lake against pyiceberg in-process.

One table written by pyiceberg on SeaweedFS (S3 plus its Iceberg REST
catalog, started here on loopback): 4 million rows (200,000 with
``--quick``) in 40 appends, ``episode_id`` ascending, so each data file
covers one id range. Lake and reference alternate run by run in each figure:

- full scan: ``SELECT *`` through a real ``lake query`` process over ADBC
  (plan, fresh pinned load at DoGet, the plug-in's pyarrow reader for a
  plain projection, Flight transfer) against pyiceberg's
  ``load_table(...).scan().to_arrow()`` in this process. Both sides read
  every row and every column into Arrow. Rows per second; goal: Lake >= 0.8x.
- the same full scan through Lake's own SDK (``iceberg_scan_sdk``):
  ``lake_sdk.Client(...).query_table`` instead of ADBC, which also follows
  the endpoint to the data plane; same reference and goal. Beside the ADBC
  figure, not instead of it: the SDK decodes with pyarrow's Flight client,
  ADBC with its Go driver plus an export to pyarrow (more client CPU).
- 1%-selective filter: ``WHERE episode_id < N`` (1% of the rows) through
  Lake against pyiceberg's ``scan(row_filter=...)``, which prunes by manifest
  statistics; Lake prunes the same way before iceberg-rust reads
  (lake_iceberg.federation.scan). Seconds per query; goal: Lake <= 1.5x.
- the plug-in's reader alone (``iceberg_scan_reader``): in this process, the
  fresh pinned load DoGet makes plus the pyarrow reader's batches of every
  column, without Flight, planner or client, against ``to_arrow``: how much
  of the full-scan gap is the reader's. Goal: >= 1.0x.

Both sides load the table from the catalog on every run, as Lake's DoGet does.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa
from pyiceberg.expressions import LessThan
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

import lake_sdk
from lake_core.config import QUERY_DATA_ADDR
from lake_query.planning.direct import batch_rows_for
from tools.bench.harness import Figure, at_least, at_most, measure, pairs_for, warmup_for
from tools.lake_testing.iceberg import SeaweedIceberg, federation_env, in_process_federation
from tools.lake_testing.servers import free_port, start_meta, start_query

NAMESPACE = "bench"
TABLE = "episodes"
APPENDS = 40
SCHEMA = Schema(
    NestedField(1, "episode_id", LongType(), required=False),
    NestedField(2, "robot_id", StringType(), required=False),
    NestedField(3, "reward", DoubleType(), required=False),
    NestedField(4, "steps", LongType(), required=False),
)

#: SCHEMA's columns as Lake promises them to clients (what a ``SELECT *`` streams).
READ_SCHEMA = pa.schema(
    [
        ("episode_id", pa.int64()),
        ("robot_id", pa.string()),
        ("reward", pa.float64()),
        ("steps", pa.int64()),
    ]
)


def _write(catalog: Any, rows: int) -> None:
    catalog.create_namespace(NAMESPACE)
    table = catalog.create_table((NAMESPACE, TABLE), schema=SCHEMA)
    arrow = SCHEMA.as_arrow()
    per = rows // APPENDS
    robots = pa.array([f"robot-{i % 16}" for i in range(per)])
    for part in range(APPENDS):
        start = part * per
        ids = pa.array(range(start, start + per), pa.int64())
        table.append(
            pa.Table.from_arrays(
                [ids, robots, pa.array([float(i % 97) / 7 for i in range(per)]), ids],
                schema=arrow,
            )
        )


def run(quick: bool) -> list[Figure]:
    rows = 200_000 if quick else 4_000_000
    selective = rows // 100
    with tempfile.TemporaryDirectory(prefix="lake-bench-iceberg-") as tmp:
        root = Path(tmp)
        server = SeaweedIceberg(root / "seaweed").start()
        try:
            catalog = server.catalog("bench")
            _write(catalog, rows)
            meta = start_meta(root / "data", root)
            try:
                # Results stream from the native data plane, as ADBC follows the
                # endpoint location (docs/dataplane.md).
                env = {
                    **federation_env(server, NAMESPACE),
                    QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}",
                }
                query = start_query(meta.addr, root, env=env)
                try:
                    figures = _measure(server, catalog, query.url, quick, rows, selective)
                finally:
                    query.stop()
            finally:
                meta.stop()
            return [*figures, _measure_reader(server, catalog, quick, rows)]
        finally:
            server.stop()


def _measure_reader(server: SeaweedIceberg, catalog: Any, quick: bool, rows: int) -> Figure:
    """The plug-in's pyarrow reader alone, in this process, against ``to_arrow``."""
    schema = READ_SCHEMA
    batch_rows = batch_rows_for(schema)
    with in_process_federation(server, NAMESPACE) as federation:
        snapshot = federation.plan(NAMESPACE, TABLE).snapshot_id

        def reader() -> float:
            start = time.perf_counter()
            table = federation.pinned(NAMESPACE, TABLE, snapshot)  # a fresh load, as DoGet
            batches = table.batches(schema, batch_rows)
            assert batches is not None  # a plain projection
            got = sum(batch.num_rows for batch in batches)
            elapsed = time.perf_counter() - start
            assert got == rows, got
            return rows / elapsed

        def reference() -> float:
            start = time.perf_counter()
            got = catalog.load_table((NAMESPACE, TABLE)).scan().to_arrow()
            elapsed = time.perf_counter() - start
            assert got.num_rows == rows, got.num_rows
            return rows / elapsed

        return measure(
            "iceberg_scan_reader",
            reader,
            reference,
            unit="rows/s",
            goal=at_least(1.0, ">= 1.0x pyiceberg to_arrow in-process (the reader alone)"),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )


def _measure(
    server: SeaweedIceberg, catalog: Any, url: str, quick: bool, rows: int, selective: int
) -> list[Figure]:
    full_sql = f"SELECT * FROM iceberg.{NAMESPACE}.{TABLE}"
    filtered_sql = f"{full_sql} WHERE episode_id < {selective}"
    conn = flightsql.connect(url)
    sdk = lake_sdk.Client(url)
    try:

        def lake_rows(sql: str, expected: int) -> float:
            start = time.perf_counter()
            with conn.cursor() as cur:
                cur.execute(sql)
                got = cur.fetch_arrow_table()
            elapsed = time.perf_counter() - start
            assert got.num_rows == expected, got.num_rows
            assert got.num_columns == len(SCHEMA.fields), got.num_columns
            return elapsed

        def sdk_rows(sql: str, expected: int) -> float:
            start = time.perf_counter()
            got = sdk.query_table(sql)
            elapsed = time.perf_counter() - start
            assert got.num_rows == expected, got.num_rows
            assert got.num_columns == len(SCHEMA.fields), got.num_columns
            return elapsed

        def reference(row_filter: Any, expected: int) -> float:
            start = time.perf_counter()
            table = catalog.load_table((NAMESPACE, TABLE))
            scan = table.scan() if row_filter is None else table.scan(row_filter=row_filter)
            got = scan.to_arrow()
            elapsed = time.perf_counter() - start
            assert got.num_rows == expected, got.num_rows
            assert got.num_columns == len(SCHEMA.fields), got.num_columns
            return elapsed

        full = measure(
            "iceberg_scan",
            lambda: rows / lake_rows(full_sql, rows),
            lambda: rows / reference(None, rows),
            unit="rows/s",
            goal=at_least(0.8, ">= 0.8x pyiceberg to_arrow in-process (full scan)"),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
        full_sdk = measure(
            "iceberg_scan_sdk",
            lambda: rows / sdk_rows(full_sql, rows),
            lambda: rows / reference(None, rows),
            unit="rows/s",
            goal=at_least(0.8, ">= 0.8x pyiceberg to_arrow in-process (full scan, Lake's SDK)"),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
        filtered = measure(
            "iceberg_scan_filtered",
            lambda: lake_rows(filtered_sql, selective),
            lambda: reference(LessThan("episode_id", selective), selective),
            unit="s",
            goal=at_most(1.5, "<= 1.5x pyiceberg scan(row_filter) in-process (1% selective)"),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
        return [full, full_sdk, filtered]
    finally:
        sdk.close()
        conn.close()
