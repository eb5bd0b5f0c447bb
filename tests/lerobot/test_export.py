"""lake export lerobot: selected episodes as a v3.0 dataset, checked against FINDINGS and the source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import lake_sdk
from lake_sdk.lerobot import export_lerobot, import_lerobot
from lake_sdk.lerobot_cli import export_group
from tests.lerobot.checker import check_dataset
from tools.lake_testing.lerobot import DatasetSpec, write_dataset
from tools.lake_testing.plugin import LakeCluster

SPEC = DatasetSpec(lengths=(4, 3, 5, 2, 3), episodes_per_file=2)


@pytest.fixture(scope="module")
def imported(shared_lake: LakeCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = write_dataset(tmp_path_factory.mktemp("lerobot") / "source", SPEC)
    check_dataset(source)  # the checker accepts what the tests write
    with lake_sdk.Client(shared_lake.query.url) as client:
        import_lerobot(
            client, source, namespace="robots", name="arm", meta_addr=shared_lake.meta.addr
        )
    return source


def test_round_trip_gives_an_equivalent_dataset(
    shared_lake: LakeCluster, imported: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with lake_sdk.Client(shared_lake.query.url) as client:
        done = export_lerobot(client, "SELECT episode_index FROM robots.arm_episodes", out)
    assert (done.episode_count, done.frame_count, done.videos_copied) == (5, 17, 6)
    source, exported = check_dataset(imported), check_dataset(out)
    # File by file where the format allows: the videos are the source's bytes.
    for path in sorted(imported.glob("videos/*/*/*.mp4")):
        assert (out / path.relative_to(imported)).read_bytes() == path.read_bytes()
    # Value by value elsewhere (parquet files are rewritten).
    assert exported["frames"] == source["frames"]
    assert exported["tasks"] == source["tasks"]

    # One data file holds every exported frame (the source spread them over several).
    def layout_free(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if k != "data/file_index"} for r in rows]

    assert layout_free(exported["episodes"]) == layout_free(source["episodes"])
    assert exported["info"] == source["info"]
    for key, shots in source["pictures"].items():
        assert all(
            np.array_equal(a, b) for a, b in zip(exported["pictures"][key], shots, strict=True)
        )
    stats = exported["stats"]
    states = np.array([f["observation.state"] for f in source["frames"]], dtype=np.float64)
    assert stats["observation.state"]["min"] == pytest.approx(states.min(axis=0).tolist())
    assert stats["observation.state"]["mean"] == pytest.approx(states.mean(axis=0).tolist())
    assert stats["observation.state"]["std"] == pytest.approx(states.std(axis=0).tolist(), abs=1e-6)
    assert stats["observation.state"]["count"] == [17]


def test_a_selection_is_renumbered_and_keeps_frames_and_pictures(
    shared_lake: LakeCluster, imported: Path, tmp_path: Path
) -> None:
    out = tmp_path / "picked"
    with lake_sdk.Client(shared_lake.query.url) as client:
        done = export_lerobot(
            client,
            "SELECT * FROM robots.arm_episodes WHERE episode_index IN (1, 4) ORDER BY length",
            out,
        )
    assert (done.episode_count, done.frame_count) == (2, 6)
    source, exported = check_dataset(imported), check_dataset(out)
    for new, old in enumerate((1, 4)):
        want = [f for f in source["frames"] if f["episode_index"] == old]
        got = [f for f in exported["frames"] if f["episode_index"] == new]
        keep = ("observation.state", "action", "timestamp", "frame_index")
        assert [{k: f[k] for k in keep} for f in got] == [{k: f[k] for k in keep} for f in want]
        assert [exported["tasks"][f["task_index"]] for f in got] == [
            source["tasks"][f["task_index"]] for f in want
        ]
        for key in ("observation.images.front", "observation.images.wrist"):
            pairs = zip(
                exported["pictures"][(key, new)], source["pictures"][(key, old)], strict=True
            )
            assert all(np.array_equal(a, b) for a, b in pairs)
    # Episodes 1 and 4 live in files 0 and 2: one copy each per camera.
    assert done.videos_copied == 4


def test_cli_exports_and_refuses_a_non_empty_directory(
    shared_lake: LakeCluster, imported: Path, tmp_path: Path
) -> None:
    out = tmp_path / "cli"
    args = ["lerobot", "SELECT episode_index FROM robots.arm_episodes WHERE length > 3", str(out)]
    args += ["--addr", shared_lake.query.url, "--output", "json"]
    result = CliRunner().invoke(export_group, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["episode_count"] == 2
    check_dataset(out)
    with lake_sdk.Client(shared_lake.query.url) as client, pytest.raises(lake_sdk.InvalidArgument):
        export_lerobot(client, "SELECT episode_index FROM robots.arm_episodes", out)
