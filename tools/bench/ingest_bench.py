"""Bulk ingest: one million rows through ADBC's ``adbc_ingest``, against Lance in process.

- ``ingest_1m_rows``: rows per second of ``cursor.adbc_ingest(table, data,
  mode="append")`` from ADBC's Flight SQL driver in this process, through a
  real ``lake query`` to a real ``lake meta`` (which checks every batch, writes
  and fsyncs Lance fragments as the stream arrives and commits them as one
  version), against ``lance.write_dataset(data, mode="append")`` of the same
  Arrow table in this process (no network, no checks, no fsync). Alternating
  pairs; goal >= 0.7.

Quick mode: 20,000 rows and few pairs (a smoke test, not a measurement).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import lance
import pyarrow as pa

from lake_core.names import TableRef
from tools.bench.harness import Figure, at_least, machine, measure, pairs_for, timed, warmup_for
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import start_meta, start_query

TABLE = TableRef("bench", "ingest")
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("robot_id", pa.utf8()),
        pa.field("reward", pa.float64()),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)


def rows(count: int) -> pa.Table:
    """``count`` rows of about 40 bytes each, in 64 Ki-row batches."""
    ids = pa.array(range(count), pa.int64())
    robots = pa.array([f"robot-{i % 97:03d}" for i in range(count)], pa.utf8())
    rewards = pa.array([(i % 101) / 100.0 for i in range(count)], pa.float64())
    stamps = pa.array(range(1_767_225_600_000_000, 1_767_225_600_000_000 + count), pa.int64())
    table = pa.table(
        [ids, robots, rewards, stamps.cast(pa.timestamp("us", tz="UTC"))], schema=SCHEMA
    )
    return pa.Table.from_batches(table.to_batches(max_chunksize=65_536), schema=SCHEMA)


def run(quick: bool) -> list[Figure]:
    count = 20_000 if quick else 1_000_000
    data = rows(count)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {"LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "keys.json"))}
        meta = start_meta(root / "data", root, env=env)
        try:
            query = start_query(meta.addr, root, env=env)
            try:
                create_table(meta.addr, TABLE, SCHEMA)
                reference_path = str(root / "reference.lance")
                lance.write_dataset(SCHEMA.empty_table(), reference_path, mode="create")
                with flightsql.connect(query.url, autocommit=True) as conn:

                    def through_lake() -> float:
                        def work() -> None:
                            with conn.cursor() as cur:
                                done = cur.adbc_ingest(
                                    TABLE.name, data, mode="append", db_schema_name=TABLE.namespace
                                )
                            assert done == count, done

                        return count / timed(work)

                    def lance_in_process() -> float:
                        return count / timed(
                            lambda: lance.write_dataset(data, reference_path, mode="append")
                        )

                    return [
                        measure(
                            "ingest_1m_rows",
                            through_lake,
                            lance_in_process,
                            unit="rows/s",
                            goal=at_least(
                                0.7, "ADBC adbc_ingest of 1M rows >= 0.7x lance.write_dataset"
                            ),
                            pairs=pairs_for(quick),
                            warmup=warmup_for(quick),
                        )
                    ]
            finally:
                query.stop()
        finally:
            meta.stop()


if __name__ == "__main__":
    print(machine())
    for figure in run(quick=False):
        print(figure.json())
