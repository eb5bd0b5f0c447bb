"""DataFrames from query results: types round-trip, FILE cells open again, extras hint."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster

RUNS = TableRef("robots", "runs")
RUNS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.utf8()),
        pa.field("steps", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("ok", pa.bool_()),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        file_field("video"),
    ]
)
STARTED = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)
SQL = "SELECT run_id, steps, reward, ok, started_at, video FROM robots.runs ORDER BY run_id"


@pytest.fixture
def runs(lake_cluster: LakeCluster, tmp_path: Path) -> tuple[LakeCluster, bytes]:
    create_table(lake_cluster.meta.addr, RUNS, RUNS_SCHEMA)
    payload = b"not really a video " * 1000
    video = tmp_path / "a.mp4"
    video.write_bytes(payload)
    with lake_sdk.Client(lake_cluster.query.url) as client:
        client.insert_many(
            "INSERT INTO robots.runs (run_id, steps, reward, ok, started_at, video) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                ["a", 7, 0.5, True, STARTED, lake_sdk.FileUpload.from_path(video, "video/mp4")],
                ["b", 8, float("nan"), False, STARTED, None],
            ],
        )
    return lake_cluster, payload


def test_pandas_round_trips_types_and_file_cells_open(runs: tuple[LakeCluster, bytes]) -> None:
    cluster, payload = runs
    with lake_sdk.Client(cluster.query.url) as client:
        frame = client.query(SQL).to_pandas()
        assert isinstance(frame, pd.DataFrame)
        assert list(frame["run_id"]) == ["a", "b"]
        assert frame["steps"].dtype == "int64"
        assert frame["ok"].dtype == "bool"
        assert str(frame["started_at"].dtype) == "datetime64[us, UTC]"
        assert frame["started_at"][0].to_pydatetime() == STARTED
        assert frame["reward"][0] == 0.5
        assert pd.isna(frame["reward"][1])
        cell = frame["video"][0]
        assert set(cell) == {"uri", "media_type", "size_bytes", "sha256"}
        assert cell["size_bytes"] == len(payload)
        assert frame["video"][1] is None
        with client.open(cell) as reader:
            assert reader.read() == payload
            assert reader.verified
        with pytest.raises(lake_sdk.InvalidArgument, match="not a FILE value"):
            client.open({"uri": "x"})


@pytest.mark.asyncio
async def test_polars_round_trips_types_and_file_cells_open(
    runs: tuple[LakeCluster, bytes],
) -> None:
    cluster, payload = runs
    async with lake_sdk.AsyncClient(cluster.query.url) as client:
        frame = await (await client.query(SQL)).to_polars()
        assert isinstance(frame, pl.DataFrame)
        assert frame.schema["steps"] == pl.Int64
        assert frame.schema["started_at"] == pl.Datetime("us", "UTC")
        assert frame["started_at"][0] == STARTED
        assert isinstance(frame.schema["video"], pl.Struct)
        cell = frame["video"][0]
        assert cell["sha256"] == hashlib.sha256(payload).hexdigest()
        reader = await client.open(cell)
        assert await reader.read() == payload
        # Back to Arrow (polars uses large strings): the same four fields, the same location.
        back = frame.to_arrow()
        assert [f.name for f in back.schema.field("video").type] == [
            f.name for f in RUNS_SCHEMA.field("video").type
        ]
        assert lake_sdk.data_location(back, "video", 0).sha256 == cell["sha256"]


BLOCKED = """
import sys, asyncio
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, Block())
import pyarrow as pa
import lake_sdk
from lake_sdk import _frames as frames
try:
    frames.{function}(pa.table({{"a": [1]}}))
except lake_sdk.MissingExtra as exc:
    assert isinstance(exc, ImportError) and isinstance(exc, lake_sdk.FailedPrecondition)
    print(exc)
else:
    raise SystemExit("no MissingExtra")
"""


@pytest.mark.parametrize(("module", "function"), [("pandas", "to_pandas"), ("polars", "to_polars")])
def test_missing_extra_names_the_pip_install(module: str, function: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED.format(module=module, function=function)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    # Lake is not on an index: the hint names the library itself (on PyPI) and the checkout path.
    assert f"pip install '{module}>=" in done.stdout
    assert f"pip install './packages/lake-sdk[{module}]' in a Lake checkout" in done.stdout
