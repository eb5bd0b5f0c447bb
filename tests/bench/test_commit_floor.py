"""The commit floor server makes exactly one Lance version per append, and nothing is lost."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow.flight as flight
import pytest

from lake_core.config import STORAGE_TIMEOUT_MS
from tools.bench.commit_floor import FloorServer, floor_rate


def _datasets(root: Path) -> list[lance.LanceDataset]:
    return [lance.dataset(str(path)) for path in sorted(root.glob("*.lance"))]


def test_every_append_is_its_own_version_on_each_table(tmp_path: Path) -> None:
    root = tmp_path / "floor"
    with FloorServer(root) as floor:
        rate = floor_rate(floor.port, tables=2, count=24, in_flight=3)
    assert rate > 0
    datasets = _datasets(root)
    assert len(datasets) == 2
    ids: list[int] = []
    for dataset in datasets:
        # Version 1 is the empty dataset; each of the table's 12 appends made one more.
        assert dataset.version == 13
        assert dataset.count_rows() == 12
        assert len(dataset.get_fragments()) == 12
        ids.extend(dataset.to_table(columns=["id"]).column("id").to_pylist())
    assert sorted(ids) == list(range(24))


def test_the_server_is_stopped_by_its_pid(tmp_path: Path) -> None:
    floor = FloorServer(tmp_path / "floor").start()
    port = floor.port
    floor.stop()
    floor.stop()  # a second stop is a no-op
    with pytest.raises(flight.FlightUnavailableError):
        floor_rate(port, tables=1, count=1, in_flight=1)


def test_a_server_that_cannot_start_says_so(tmp_path: Path) -> None:
    # A storage setting out of range makes the child exit before it listens.
    env = {"PATH": "/usr/bin:/bin", STORAGE_TIMEOUT_MS.name: "0"}
    with pytest.raises(RuntimeError, match="did not start"):
        FloorServer("s3://nowhere/floor", env).start()
