"""A 2-million-row, multi-fragment table behind two Query replicas (built once)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.config import COMPACTION, MANAGED_OBJECT_ROOT, QUERY_TICKET_KEYS_FILE
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.servers import start_meta

SAMPLES = TableRef("training", "samples")
SAMPLES_SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64()), ("label", pa.int32())])
SAMPLE_ROWS = 2_000_000
#: Concurrent appenders: appends are capped at MAX_APPEND_ROWS rows (one fragment each).
WRITERS = 8


def sample_rows(start: int, count: int) -> pa.RecordBatch:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), pa.array((ids % 1000) / 1000.0), pa.array((ids % 10).astype(np.int32))],
        schema=SAMPLES_SCHEMA,
    )


@dataclass(frozen=True)
class Samples:
    """The cluster and the table's rows as the test wrote them."""

    cluster: LakeCluster
    expected: pa.Table


def _load(meta_addr: str) -> None:
    async def load() -> None:
        async with MetaClient(f"http://{meta_addr}", timeout_s=120) as client:
            await client.create_table(SAMPLES, SAMPLES_SCHEMA)
            starts = list(range(0, SAMPLE_ROWS, protocol.MAX_APPEND_ROWS))

            async def writer() -> None:
                while starts:
                    start = starts.pop()
                    command = protocol.AppendCommand(table=SAMPLES, operation_id=new_operation_id())
                    await client.append(
                        command, SAMPLES_SCHEMA, [sample_rows(start, protocol.MAX_APPEND_ROWS)]
                    )

            await asyncio.gather(*(writer() for _ in range(WRITERS)))

    asyncio.run(load())


@pytest.fixture(scope="package")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Samples]:
    """Two replicas sharing a key ring over ``training.samples`` (2 M rows, 200 fragments)."""
    root = tmp_path_factory.mktemp("samples")
    env = {
        QUERY_TICKET_KEYS_FILE: str(write_ticket_keys(root / "ticket-keys.json")),
        MANAGED_OBJECT_ROOT: str(root / "data" / "objects"),
        # The background compactor would merge the 200 appends into one or two
        # fragments mid-test; partitions follow fragments.
        COMPACTION: "off",
    }
    cluster = LakeCluster(root=root, meta=start_meta(root / "data", root, env=env), env=env)
    try:
        _load(cluster.meta.addr)
        cluster.add_query()
        cluster.add_query()
        expected = pa.Table.from_batches([sample_rows(0, SAMPLE_ROWS)])
        yield Samples(cluster, expected)
    finally:
        cluster.stop()


def rows_of(table: pa.Table) -> pa.Table:
    """``table`` in a canonical order, so equal multisets compare equal."""
    return table.sort_by([("id", "ascending")]).combine_chunks()
