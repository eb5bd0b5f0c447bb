"""Verify-on-open is the default, incremental, and can be turned off (issue 36, item 4).

Real Metasrv and Query processes, no ``LAKE_QUERY_VERIFY_ON_OPEN`` set:

- a byte flipped in a table's data file before a replica first reads it makes
  every one of a set of varied queries fail with DATA_LOSS
  (:class:`DataCorrupted`); none returns rows;
- once the byte is restored the queries answer, and after an append the
  replica hashes only the new data files (``lake_query_verified_files_total``
  and ``_bytes_total`` on its /metrics);
- with ``LAKE_QUERY_VERIFY_ON_OPEN=false`` the same corruption is not checked:
  nothing is hashed and a query Lance can answer without decoding the
  damaged bytes (``count(*)``) returns rows, as before this release.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.errors import DataCorrupted
from lake_core.names import TableRef
from tests.telemetry.scrape import scrape, value
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import LakeProcess, free_port, start_query
from tools.lake_testing.waiting import until

TABLE = TableRef("integrity", "defaults")
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("i32", pa.int32()),
        ("f64", pa.float64()),
        ("name", pa.utf8()),
    ]
)
ROWS = 1_000
QUERIES = (
    f"SELECT * FROM {TABLE.qualified}",
    f"SELECT count(*) FROM {TABLE.qualified}",
    f"SELECT sum(i32), max(f64) FROM {TABLE.qualified}",
    f"SELECT id FROM {TABLE.qualified} WHERE id = 7",
    f"SELECT name FROM {TABLE.qualified} ORDER BY id DESC LIMIT 3",
    f"SELECT id % 3 AS k, avg(f64) FROM {TABLE.qualified} GROUP BY id % 3",
    f"SELECT count(DISTINCT name) FROM {TABLE.qualified} WHERE f64 > 10",
    f"SELECT id FROM {TABLE.qualified} WHERE name LIKE 'robot-0001%'",
)


def rows(start: int) -> pa.RecordBatch:
    ids = list(range(start, start + ROWS))
    return pa.RecordBatch.from_pydict(
        {
            "id": ids,
            "i32": [i * 7 - 5000 for i in ids],
            "f64": [i * 1.25 for i in ids],
            "name": [f"robot-{i:05d}" for i in ids],
        },
        schema=SCHEMA,
    )


def flip(path: Path, position: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0xFF]))


def data_files(cluster: LakeCluster) -> set[Path]:
    dataset = cluster.root / "data" / "tables" / "integrity" / "defaults.lance"
    return set((dataset / "data").glob("*.lance"))


def replica(cluster: LakeCluster, tmp_path: Path, **env: str) -> tuple[LakeProcess, int]:
    port = free_port()
    process = start_query(
        cluster.meta.addr,
        tmp_path,
        env={**cluster.env, "LAKE_METRICS_ADDR": f"127.0.0.1:{port}", **env},
    )
    return process, port


def test_verification_is_on_by_default_and_reads_each_file_once(
    lake_cluster: LakeCluster, tmp_path: Path
) -> None:
    create_table(lake_cluster.meta.addr, TABLE, SCHEMA)
    with lake_sdk.Client(lake_cluster.query.url) as sdk:
        sdk.append_batches(TABLE, [rows(0)])
    [first] = data_files(lake_cluster)
    position = first.stat().st_size // 2
    flip(first, position)  # before the new replica ever read it

    checked, port = replica(lake_cluster, tmp_path)
    try:
        with lake_sdk.Client(checked.url) as sdk:
            for sql in QUERIES:
                with pytest.raises(DataCorrupted, match=r"integrity\.defaults version 1"):
                    sdk.query_table(sql)
        metrics = scrape(port)
        # A file that failed is read again on every open (a query may open twice).
        assert value(metrics, "lake_query_verified_files_total", outcome="mismatch") >= len(QUERIES)
        flip(first, position)  # repaired

        with lake_sdk.Client(checked.url) as sdk:
            for sql in QUERIES:
                assert sdk.query_table(sql).num_rows >= 1, sql
            metrics = scrape(port)
            assert value(metrics, "lake_query_verified_files_total", outcome="ok") == 1
            hashed = value(metrics, "lake_query_verified_bytes_total")

            sdk.append_batches(TABLE, [rows(ROWS)])
            added = data_files(lake_cluster) - {first}
            assert added
            for sql in QUERIES:
                assert sdk.query_table(sql).num_rows >= 1, sql
        metrics = scrape(port)
        # Only the append's files were read; the first one stays verified.
        assert value(metrics, "lake_query_verified_files_total", outcome="ok") == 1 + len(added)
        assert value(metrics, "lake_query_verified_bytes_total") == hashed + sum(
            p.stat().st_size for p in added
        )
    finally:
        checked.stop()


def test_turning_verification_off_serves_without_checking(
    lake_cluster: LakeCluster, tmp_path: Path
) -> None:
    create_table(lake_cluster.meta.addr, TABLE, SCHEMA)
    with lake_sdk.Client(lake_cluster.query.url) as sdk:
        sdk.append_batches(TABLE, [rows(0)])
    [first] = data_files(lake_cluster)
    flip(first, first.stat().st_size // 2)

    unchecked, port = replica(lake_cluster, tmp_path, LAKE_QUERY_VERIFY_ON_OPEN="false")
    try:
        with lake_sdk.Client(unchecked.url) as sdk:
            counted = sdk.query_table(f"SELECT count(*) AS n FROM {TABLE.qualified}")
        assert counted.column("n").to_pylist() == [ROWS]
        assert value(scrape(port), "lake_query_verified_bytes_total") == 0
    finally:
        unchecked.stop()


def test_new_versions_of_a_table_being_read_are_verified_before_the_next_query(
    lake_cluster: LakeCluster, tmp_path: Path
) -> None:
    """Another replica's appends reach this one by a catalog refresh; it verifies them then."""
    cold = TableRef("integrity", "unread")
    create_table(lake_cluster.meta.addr, TABLE, SCHEMA)
    create_table(lake_cluster.meta.addr, cold, SCHEMA)
    with lake_sdk.Client(lake_cluster.query.url) as writer:
        writer.append_batches(TABLE, [rows(0)])
        writer.append_batches(cold, [rows(0)])
        checked, port = replica(lake_cluster, tmp_path)
        try:
            with lake_sdk.Client(checked.url) as reader:
                assert reader.query_table(QUERIES[1]).to_pylist() == [{"count(*)": ROWS}]
                until(
                    lambda: (
                        value(scrape(port), "lake_query_verified_files_total", outcome="ok") == 1
                    ),
                    30,
                    "the first file verified",
                )
                before = data_files(lake_cluster)
                writer.append_batches(TABLE, [rows(ROWS)])
                writer.append_batches(cold, [rows(ROWS)])  # nobody reads it here
                added = data_files(lake_cluster) - before
                assert len(added) == 1
                until(
                    lambda: (
                        value(scrape(port), "lake_query_verified_ahead_total", outcome="ok") >= 1
                    ),
                    30,
                    "the new version verified ahead",
                )
                metrics = scrape(port)
                assert value(metrics, "lake_query_verified_files_total", outcome="ok") == 2
                verified_bytes = value(metrics, "lake_query_verified_bytes_total")
                assert verified_bytes == sum(p.stat().st_size for p in before | added)
                # The query that reads the new version reads no file again.
                assert reader.query_table(QUERIES[1]).to_pylist() == [{"count(*)": 2 * ROWS}]
                metrics = scrape(port)
                assert value(metrics, "lake_query_verified_files_total", outcome="ok") == 2
                assert value(metrics, "lake_query_verified_bytes_total") == verified_bytes
        finally:
            checked.stop()
