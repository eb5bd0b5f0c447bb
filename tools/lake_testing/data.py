"""Small, deterministic test data and admin helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from lake_core import protocol
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef

EPISODES = TableRef("robots", "episodes")
ROBOTS = TableRef("robots", "fleet")

EPISODES_SCHEMA = pa.schema(
    [
        pa.field("episode_id", pa.utf8()),
        pa.field("robot_id", pa.utf8()),
        pa.field("reward", pa.float64()),
        pa.field("steps", pa.int64()),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
        pa.field("success", pa.bool_()),
        pa.field("notes", pa.utf8()),
    ]
)
ROBOTS_SCHEMA = pa.schema(
    [
        pa.field("robot_id", pa.utf8()),
        pa.field("site", pa.utf8()),
        pa.field("payload_kg", pa.float32()),
        pa.field("serial", pa.int32()),
        pa.field("firmware", pa.binary()),
    ]
)


def episodes(start: int, count: int) -> pa.RecordBatch:
    ids = range(start, start + count)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    return pa.RecordBatch.from_pydict(
        {
            "episode_id": [f"ep-{i:07d}" for i in ids],
            "robot_id": [f"robot-{i % 5}" for i in ids],
            "reward": [(i % 101) / 100.0 for i in ids],
            "steps": list(ids),
            "recorded_at": [base + timedelta(seconds=i) for i in ids],
            "success": [i % 3 == 0 for i in ids],
            # Operator notes make rows realistically wide (~200 bytes), so 20,000
            # rows span several 2 MB Flight batches.
            "notes": [
                f"episode {i}: pick-and-place, bin {i % 17}, " + "nominal; " * 18 for i in ids
            ],
        },
        schema=EPISODES_SCHEMA,
    )


def robots() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "robot_id": [f"robot-{i}" for i in range(5)],
            "site": ["lab-a", "lab-a", "lab-b", "lab-b", "field"],
            "payload_kg": [1.5, 2.0, 2.5, 3.0, 3.5],
            "serial": [1000 + i for i in range(5)],
            "firmware": [bytes([i, 255 - i]) for i in range(5)],
        },
        schema=ROBOTS_SCHEMA,
    )


def create_table(meta_addr: str, table: TableRef, schema: pa.Schema) -> int:
    """Create a table through Metasrv's admin action; returns its version."""

    async def go() -> int:
        async with MetaClient(f"http://{meta_addr}") as client:
            result = await client.create_table(table, schema)
            return result.entry.descriptor.version

    return asyncio.run(go())


def describe_version(meta_addr: str, table: TableRef) -> int:
    async def go() -> int:
        async with MetaClient(f"http://{meta_addr}") as client:
            return (await client.describe_table(table)).entry.descriptor.version

    return asyncio.run(go())


def bulk_load(
    meta_addr: str,
    table: TableRef,
    schema: pa.Schema,
    rows: int,
    make_rows: Callable[[int, int], pa.RecordBatch],
    *,
    writers: int = 8,
    timeout_s: float = 120,
) -> None:
    """Create ``table`` and append rows ``0..rows`` as a bulk load would.

    Appends are capped at ``MAX_APPEND_ROWS`` rows (one fragment each), so
    ``writers`` concurrent appenders share the chunks; ``make_rows(start,
    count)`` builds each chunk. The order chunks commit in is not fixed.
    """

    async def load() -> None:
        async with MetaClient(f"http://{meta_addr}", timeout_s=timeout_s) as client:
            await client.create_table(table, schema)
            starts = list(range(0, rows, protocol.MAX_APPEND_ROWS))

            async def writer() -> None:
                while starts:
                    start = starts.pop()
                    count = min(protocol.MAX_APPEND_ROWS, rows - start)
                    command = protocol.AppendCommand(table=table, operation_id=new_operation_id())
                    await client.append(command, schema, [make_rows(start, count)])

            await asyncio.gather(*(writer() for _ in range(writers)))

    asyncio.run(load())
