"""Fragment ranges of a partitioned scan, its limits and its tickets' fragment ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest

from lake_core.config import QUERY_MAX_ENDPOINTS, QUERY_MIN_ENDPOINT_ROWS
from lake_core.errors import ConfigError, InvalidArgument
from lake_query.config import QueryConfig
from lake_query.planning.direct import DirectScan
from lake_query.planning.partitions import (
    PartitionLimits,
    fragment_ranges,
    partition_ids,
    scan_partition,
)
from lake_query.planning.sql_errors import sql_error

SIZES = [100, 300, 50, 50, 500, 200, 100, 100, 400, 200]
SCHEMA = pa.schema([("id", pa.int64())])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    uri = str(tmp_path_factory.mktemp("parts") / "t.lance")
    start = 0
    for i, size in enumerate(SIZES):
        batch = pa.table({"id": pa.array(range(start, start + size), pa.int64())})
        lance.write_dataset(batch, uri, mode="append" if i else "create")
        start += size
    return lance.dataset(uri)


def plan(row_filter: str | None = None) -> DirectScan:
    return DirectScan(columns=["id"], row_filter=row_filter, batch_rows=1024, schema=SCHEMA)


def test_ranges_are_contiguous_balanced_and_cover_every_fragment(dataset: Any) -> None:
    ranges = fragment_ranges(dataset, plan(), PartitionLimits(max_endpoints=4, min_endpoint_rows=1))
    assert len(ranges) == 4
    flat = [f for r in ranges for f in r]
    assert flat == sorted(f.fragment_id for f in dataset.get_fragments())
    rows = {f.fragment_id: f.metadata.physical_rows for f in dataset.get_fragments()}
    sizes = [sum(rows[f] for f in r) for r in ranges]
    assert sum(sizes) == sum(SIZES)
    assert max(sizes) <= 2 * sum(SIZES) / 4  # balanced by stored rows, not fragment count
    # The same version and limits always give the same ranges.
    again = fragment_ranges(dataset, plan(), PartitionLimits(max_endpoints=4, min_endpoint_rows=1))
    assert again == ranges


def test_the_limits_bound_the_endpoint_count(dataset: Any) -> None:
    total = sum(SIZES)
    assert fragment_ranges(dataset, plan(), PartitionLimits(1, 1)) == ()
    assert len(fragment_ranges(dataset, plan(), PartitionLimits(256, 1))) == len(SIZES)
    assert len(fragment_ranges(dataset, plan(), PartitionLimits(8, total // 3))) == 3
    assert fragment_ranges(dataset, plan(), PartitionLimits(8, total // 2 + 1)) == ()


def test_a_filter_lance_cannot_plan_keeps_one_endpoint(dataset: Any) -> None:
    limits = PartitionLimits(4, 1)
    assert len(fragment_ranges(dataset, plan("id < 500"), limits)) == 4
    assert fragment_ranges(dataset, plan("no_such_column = 1"), limits) == ()


def test_a_filtered_scan_of_an_indexed_table_keeps_one_endpoint(tmp_path: Path) -> None:
    uri = str(tmp_path / "indexed.lance")
    for i in range(4):
        batch = pa.table({"id": pa.array(range(i * 100, (i + 1) * 100), pa.int64())})
        lance.write_dataset(batch, uri, mode="append" if i else "create")
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    indexed = lance.dataset(uri)
    limits = PartitionLimits(4, 1)
    assert fragment_ranges(indexed, plan("id = 7"), limits) == ()
    assert len(fragment_ranges(indexed, plan(), limits)) == 4  # an unfiltered scan still splits


def test_a_partition_scans_only_its_fragments(dataset: Any) -> None:
    ranges = fragment_ranges(dataset, plan("id >= 100"), PartitionLimits(4, 1))
    parts = [
        pa.Table.from_batches(list(scan_partition(dataset, plan("id >= 100"), r, sql_error)))
        for r in ranges
    ]
    ids = sorted(i for p in parts for i in p.column("id").to_pylist())
    assert ids == list(range(100, sum(SIZES)))


def test_a_ticket_naming_what_its_version_lacks_is_refused(dataset: Any) -> None:
    with pytest.raises(InvalidArgument, match="incompatible"):
        scan_partition(dataset, plan(), [999], sql_error)
    with pytest.raises(InvalidArgument, match="incompatible"):
        scan_partition(dataset, None, [0], sql_error)
    for raw in (None, [], [True], [-1], ["1"], {"0": 1}, [1.0]):
        with pytest.raises(InvalidArgument):
            partition_ids(raw)
    assert partition_ids([0, 3]) == [0, 3]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (QUERY_MAX_ENDPOINTS, "0"),
        (QUERY_MAX_ENDPOINTS, "257"),
        (QUERY_MAX_ENDPOINTS, "eight"),
        (QUERY_MIN_ENDPOINT_ROWS, "0"),
    ],
)
def test_bad_limits_fail_configuration(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        QueryConfig.load(env={name: value})


def test_limits_are_read_from_the_environment() -> None:
    config = QueryConfig.load(env={QUERY_MAX_ENDPOINTS: "3", QUERY_MIN_ENDPOINT_ROWS: "10"})
    assert config.partitions == PartitionLimits(max_endpoints=3, min_endpoint_rows=10)
    assert QueryConfig.load(env={}).partitions == PartitionLimits()
