"""Reusing opened datasets across requests, never past their version's lifetime."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.dataset import LanceDataset

from lake_query.planning.pinned import PinnedDatasets

SCHEMA = pa.schema([("id", pa.int64())])


def rows(start: int, count: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + count))}, schema=SCHEMA)


class Opener:
    def __init__(self, location: str, version: int) -> None:
        self.location, self.version, self.calls = location, version, 0

    def __call__(self) -> Any:
        self.calls += 1
        return lance.dataset(self.location, version=self.version)


def test_a_pinned_version_is_opened_once(tmp_path: Path) -> None:
    location = str(tmp_path / "t.lance")
    version = lance.write_dataset(rows(0, 5), location).version
    cache, opener = PinnedDatasets(), Opener(location, version)
    first = cache.open(location, "inc-1", version, opener)
    lance.write_dataset(rows(5, 5), location, mode="append")  # newer versions do not matter
    assert cache.open(location, "inc-1", version, opener) is first
    assert opener.calls == 1
    assert first.count_rows() == 5


def test_a_reclaimed_version_is_not_served_from_the_cache(tmp_path: Path) -> None:
    location = str(tmp_path / "t.lance")
    version = lance.write_dataset(rows(0, 5), location).version
    cache, opener = PinnedDatasets(), Opener(location, version)
    cache.open(location, "inc-1", version, opener)
    for i in range(3):
        lance.write_dataset(rows(10 + i, 1), location, mode="append")
    LanceDataset(location).cleanup_old_versions(older_than=timedelta(0), retain_versions=1)
    # The data file lives on under newer versions, but the version is gone.
    with pytest.raises(ValueError, match=r"(?i)not found"):
        cache.open(location, "inc-1", version, opener)
    assert opener.calls == 2


def test_a_recreated_dataset_at_the_same_path_is_opened_afresh(tmp_path: Path) -> None:
    location = str(tmp_path / "t.lance")
    version = lance.write_dataset(rows(0, 5), location).version
    cache, opener = PinnedDatasets(), Opener(location, version)
    cache.open(location, "inc-1", version, opener)
    shutil.rmtree(location)
    assert lance.write_dataset(rows(100, 2), location).version == version  # numbers restart
    again = cache.open(location, "inc-1", version, opener)
    assert opener.calls == 2
    assert again.to_table()["id"].to_pylist() == [100, 101]


def test_object_store_datasets_are_not_cached() -> None:
    cache, calls = PinnedDatasets(), []
    for _ in range(2):
        cache.open("s3://bucket/t.lance", "inc-1", 1, lambda: calls.append(1) or object())
    assert len(calls) == 2
    assert len(cache) == 0


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    cache = PinnedDatasets(capacity=2)
    for i in range(4):
        location = str(tmp_path / f"t{i}.lance")
        version = lance.write_dataset(rows(0, 1), location).version
        cache.open(location, "inc", version, Opener(location, version))
    assert len(cache) == 2
