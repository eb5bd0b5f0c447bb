"""Fixtures for the training-data tests.

A 400,000-row, 40-fragment table behind two Query replicas (built once);
the local and S3 stages of the file tests live in open_file_support.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest

from lake_core.config import (
    COMPACTION,
    MANAGED_OBJECT_ROOT,
    QUERY_MIN_ENDPOINT_ROWS,
    QUERY_TICKET_KEYS_FILE,
)
from lake_core.names import TableRef
from tests.training.open_file_support import (  # noqa: F401 (fixtures)
    _local_stage_servers,
    _s3_stage_servers,
    local_stage,
    s3_stage,
)
from tools.lake_testing.data import bulk_load
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.servers import start_meta

SAMPLES = TableRef("training", "samples")
SAMPLES_SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64()), ("label", pa.int32())])
#: Enough rows for many fragments and several endpoints; the size itself is not under test.
SAMPLE_ROWS = 400_000
#: Rows per endpoint at the least, scaled with the table so a plain scan splits into
#: 7 endpoints as 2 M rows do under the default (the defaults have unit tests).
MIN_ENDPOINT_ROWS = 57_000
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


@pytest.fixture(scope="package")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Samples]:
    """Two replicas sharing a key ring over ``training.samples`` (400,000 rows, 40 fragments)."""
    root = tmp_path_factory.mktemp("samples")
    env = {
        QUERY_TICKET_KEYS_FILE: str(write_ticket_keys(root / "ticket-keys.json")),
        MANAGED_OBJECT_ROOT: str(root / "data" / "objects"),
        # The background compactor would merge the 40 appends into one or two
        # fragments mid-test; partitions follow fragments.
        COMPACTION: "off",
        QUERY_MIN_ENDPOINT_ROWS: str(MIN_ENDPOINT_ROWS),
    }
    cluster = LakeCluster(root=root, meta=start_meta(root / "data", root, env=env), env=env)
    try:
        bulk_load(
            cluster.meta.addr, SAMPLES, SAMPLES_SCHEMA, SAMPLE_ROWS, sample_rows, writers=WRITERS
        )
        cluster.add_queries(2)
        expected = pa.Table.from_batches([sample_rows(0, SAMPLE_ROWS)])
        yield Samples(cluster, expected)
    finally:
        cluster.stop()


def rows_of(table: pa.Table) -> pa.Table:
    """``table`` in a canonical order, so equal multisets compare equal."""
    return table.sort_by([("id", "ascending")]).combine_chunks()
