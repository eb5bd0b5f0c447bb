"""lake export lerobot: selected episodes as a v3.0 dataset, checked against FINDINGS and the source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

import lake_sdk
from lake_sdk.errors import InvalidDataset
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
    # Cameras: per channel over the decoded frames (every frame of an episode under 100 is
    # sampled), in 0..1, shaped (3, 1, 1) as LeRobot writes them.
    for key in ("observation.images.front", "observation.images.wrist"):
        pixels = np.stack(
            [p for (k, _), shots in exported["pictures"].items() if k == key for p in shots]
        ).astype(np.float64)
        channels = pixels.reshape(-1, 3) / 255.0
        got = stats[key]
        assert got["count"] == [17]
        for name, want in (
            ("min", channels.min(axis=0)),
            ("max", channels.max(axis=0)),
            ("mean", channels.mean(axis=0)),
            ("std", channels.std(axis=0)),
        ):
            assert np.asarray(got[name]).shape == (3, 1, 1), name
            assert np.asarray(got[name]).ravel() == pytest.approx(want, abs=1e-9), name


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
    # Per camera: episode 1 is cut out of file 0 (which also holds episode 0), file 2 (episode
    # 4 alone) is copied whole.
    assert (done.videos_copied, done.videos_cut) == (2, 2)


def test_a_selection_gets_the_video_stats_of_its_episodes_only(
    shared_lake: LakeCluster, imported: Path, tmp_path: Path
) -> None:
    out = tmp_path / "two"
    with lake_sdk.Client(shared_lake.query.url) as client:
        export_lerobot(
            client, "SELECT episode_index FROM robots.arm_episodes WHERE episode_index > 2", out
        )
    exported = check_dataset(out)
    key = "observation.images.wrist"
    pixels = np.stack(
        [p for (k, _), shots in exported["pictures"].items() if k == key for p in shots]
    )
    channels = pixels.reshape(-1, 3).astype(np.float64) / 255.0
    got = exported["stats"][key]
    assert got["count"] == [5]
    assert np.asarray(got["mean"]).ravel() == pytest.approx(channels.mean(axis=0), abs=1e-9)
    assert np.asarray(got["std"]).ravel() == pytest.approx(channels.std(axis=0), abs=1e-9)


def test_files_are_split_by_the_limits_in_info_json(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    # Two files per chunk, and data files so small that each episode starts a new one.
    spec = DatasetSpec(
        lengths=(4, 3, 5, 2, 3), episodes_per_file=2, chunks_size=2, data_files_size_in_mb=1e-4
    )
    source = write_dataset(tmp_path / "small", spec)
    out, again = tmp_path / "out", tmp_path / "again"
    with lake_sdk.Client(shared_lake.query.url) as client:
        import_lerobot(
            client, source, namespace="robots", name="small", meta_addr=shared_lake.meta.addr
        )
        export_lerobot(client, "SELECT episode_index FROM robots.small_episodes", out)
        exported = check_dataset(out)
        slots = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
        data = [(e["data/chunk_index"], e["data/file_index"]) for e in exported["episodes"]]
        assert data == slots
        assert sorted(p.relative_to(out).as_posix() for p in out.glob("data/*/*")) == [
            f"data/chunk-{c:03d}/file-{f:03d}.parquet" for c, f in slots
        ]
        for key in ("observation.images.front", "observation.images.wrist"):
            videos = [
                (e[f"videos/{key}/chunk_index"], e[f"videos/{key}/file_index"])
                for e in exported["episodes"]
            ]
            assert videos == [(0, 0), (0, 0), (0, 1), (0, 1), (1, 0)]
            assert len(list(out.glob(f"videos/{key}/*/*.mp4"))) == 3
        assert exported["frames"] == check_dataset(source)["frames"]
        # The split dataset imports again, frame for frame, and exports the same layout.
        import_lerobot(
            client, out, namespace="robots", name="again", meta_addr=shared_lake.meta.addr
        )
        frames = client.query_table("SELECT * FROM robots.again_frames ORDER BY index")
        assert frames.num_rows == 17
        assert frames.column("episode_index").to_pylist() == [
            f["episode_index"] for f in exported["frames"]
        ]
        export_lerobot(client, "SELECT episode_index FROM robots.again_episodes", again)
    assert check_dataset(again)["episodes"] == exported["episodes"]


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


def test_a_selection_without_episode_index_is_refused(
    shared_lake: LakeCluster, imported: Path, tmp_path: Path
) -> None:
    out = tmp_path / "none"
    refused = pytest.raises(lake_sdk.InvalidArgument, match="must return episode_index")
    with lake_sdk.Client(shared_lake.query.url) as client, refused:
        export_lerobot(client, "SELECT length FROM robots.arm_episodes", out)
    assert not list(out.glob("**/*.mp4"))


def test_a_failed_export_leaves_nothing_behind(shared_lake: LakeCluster, tmp_path: Path) -> None:
    source = write_dataset(tmp_path / "source", SPEC)
    out = tmp_path / "exports" / "out"
    with lake_sdk.Client(shared_lake.query.url) as client:
        import_lerobot(
            client, source, namespace="robots", name="extra", meta_addr=shared_lake.meta.addr
        )
        # A frame too many for episode 0: found only once its videos and data files are written.
        one = client.query_table("SELECT * FROM robots.extra_frames WHERE index = 0")
        client.append_batches("robots.extra_frames", one.to_batches())
        with pytest.raises(InvalidDataset, match="episode 0 has 5 frames"):
            export_lerobot(client, "SELECT episode_index FROM robots.extra_episodes", out)
        assert not out.exists()
        assert list(out.parent.iterdir()) == []  # nor a staging directory beside it
        # A path that is a file is refused plainly, the file untouched.
        (tmp_path / "a-file").write_text("mine")
        with pytest.raises(lake_sdk.InvalidArgument, match="not a directory"):
            export_lerobot(
                client, "SELECT episode_index FROM robots.extra_episodes", tmp_path / "a-file"
            )
        assert (tmp_path / "a-file").read_text() == "mine"
        # A selection of no episodes is no dataset: refused, nothing written.
        with pytest.raises(lake_sdk.InvalidArgument, match="selects no episodes"):
            export_lerobot(
                client, "SELECT episode_index FROM robots.extra_episodes WHERE false", out
            )
        assert list(out.parent.iterdir()) == []


def test_an_episode_without_its_video_is_refused_and_spares_other_exports(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    source = write_dataset(tmp_path / "source", DatasetSpec(lengths=(2, 3)))
    select = "SELECT episode_index FROM robots.nullfile_episodes WHERE episode_index = "
    with lake_sdk.Client(shared_lake.query.url) as client:
        import_lerobot(
            client, source, namespace="robots", name="nullfile", meta_addr=shared_lake.meta.addr
        )
        # An episodes row added by hand, its front camera's FILE value null.
        row = client.query_table(f"{select.replace('episode_index FROM', '* FROM')}1").to_pylist()[
            0
        ]
        row.update(episode_index=7, observation__images__front=None)
        schema = client.table_schema("robots.nullfile_episodes")
        client.append_batches(
            "robots.nullfile_episodes", [pa.RecordBatch.from_pylist([row], schema=schema)]
        )
        with pytest.raises(InvalidDataset, match=r"episode 7 has no observation\.images\.front"):
            export_lerobot(client, f"{select}7", tmp_path / "seven")
        done = export_lerobot(client, f"{select}0", tmp_path / "zero")
    assert (done.episode_count, done.frame_count) == (1, 2)
    check_dataset(tmp_path / "zero")
