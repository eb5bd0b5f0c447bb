"""Commit throughput: appends per second through Metasrv on the embedded registry.

Lake's figure drives Metasrv's own DoPut append path with the Metasrv wire
client (8 appends in flight on one table, as independent writers would). The
reference is the floor of any commit protocol on this machine: an in-process
SQLite compare-and-swap loop (WAL, synchronous=FULL) that bumps a version.
Goal: at least 500 appends/s.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from lake_core import protocol
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tools.bench.harness import Figure, measure
from tools.lake_testing.servers import start_meta

TABLE = TableRef("bench", "commits")
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64())])
IN_FLIGHT = 8


def _batch(start: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": [start], "value": [start * 0.5]}, schema=SCHEMA)


def _sqlite_cas_rate(path: Path, count: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, version INTEGER)")
    db.execute("INSERT OR IGNORE INTO t VALUES (1, 0)")
    start = time.perf_counter()
    for _ in range(count):
        (version,) = db.execute("SELECT version FROM t WHERE id = 1").fetchone()
        db.execute("BEGIN IMMEDIATE")
        changed = db.execute(
            "UPDATE t SET version = ? WHERE id = 1 AND version = ?", (version + 1, version)
        ).rowcount
        db.execute("COMMIT")
        assert changed == 1
    elapsed = time.perf_counter() - start
    db.close()
    return count / elapsed


async def _lake_rate(meta_addr: str, count: int, next_id: list[int]) -> float:
    async with MetaClient(f"http://{meta_addr}") as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for _ in range(count):
            queue.put_nowait(next_id[0])
            next_id[0] += 1

        async def worker() -> None:
            while not queue.empty():
                row = queue.get_nowait()
                command = protocol.AppendCommand(table=TABLE, operation_id=new_operation_id())
                await client.append(command, SCHEMA, [_batch(row)])

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
        return count / (time.perf_counter() - start)


def run(quick: bool) -> list[Figure]:
    count = 100 if quick else 400
    with tempfile.TemporaryDirectory(prefix="lake-bench-commit-") as tmp:
        root = Path(tmp)
        meta = start_meta(root / "data", root)
        try:

            async def create() -> None:
                async with MetaClient(f"http://{meta.addr}") as admin:
                    await admin.create_table(TABLE, SCHEMA)

            asyncio.run(create())
            next_id = [0]
            return [
                measure(
                    "commit_throughput_embedded",
                    lambda: asyncio.run(_lake_rate(meta.addr, count, next_id)),
                    lambda: _sqlite_cas_rate(root / "cas.sqlite3", count),
                    unit="appends/s",
                    goal=">= 500 appends/s",
                    ratio_of=lambda lake, ref: lake / ref,
                    met=lambda lake, ref, ratio: lake >= 500,
                    threshold=lambda lake, ref: 500 / ref,
                )
            ]
        finally:
            meta.stop()
