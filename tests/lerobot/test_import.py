"""lake import lerobot: a v3.0 dataset (written here with pyarrow and PyAV) into three tables."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import lake_sdk
from lake_core.faults import CRASH_EXIT_CODE, LEROBOT_AFTER_VIDEO_UPLOAD
from lake_core.filetype import is_file_field
from lake_sdk.errors import InvalidDataset
from lake_sdk.lerobot import FEATURE_KEY, column_name, import_lerobot
from lake_sdk.lerobot.layout import INFO_KEY
from lake_sdk.lerobot_cli import import_group
from tests.recordings.conftest import objects
from tools.lake_testing.lerobot import CAMERAS, TASKS, DatasetSpec, write_dataset
from tools.lake_testing.plugin import LakeCluster

_names = itertools.count()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("lerobot") / "pick_place")


def _name() -> str:
    return f"ds{next(_names)}"


def test_import_keeps_every_frame_episode_task_and_video(
    shared_lake: LakeCluster, dataset: Path
) -> None:
    name = _name()
    stored = objects(shared_lake.root / "data" / "objects")
    with lake_sdk.Client(shared_lake.query.url) as client:
        done = import_lerobot(
            client, dataset, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
        )
        assert (done.episode_count, done.frame_count, done.videos_uploaded) == (4, 14, 4)
        # Frames: every column, its exact type and values, its feature name in the metadata.
        source = pa.concat_tables(
            pq.read_table(p) for p in sorted(dataset.glob("data/chunk-*/file-*.parquet"))
        )
        frames = client.query_table(f"SELECT * FROM robots.{name}_frames ORDER BY index")
        schema = client.table_schema(f"robots.{name}_frames")
        assert schema.names == [column_name(n) for n in source.column_names]
        assert [f.metadata[FEATURE_KEY].decode() for f in schema] == source.column_names
        assert [f.type for f in schema] == [f.type for f in source.schema]
        info = json.loads((dataset / "meta/info.json").read_text())
        assert json.loads(schema.field(0).metadata[INFO_KEY]) == info
        assert frames.rename_columns(source.column_names).to_pylist() == source.to_pylist()
        # Episodes: one row each, the camera MP4s as FILE values with their time windows.
        meta = pq.read_table(dataset / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        episodes = client.query_table(
            f"SELECT * FROM robots.{name}_episodes ORDER BY episode_index"
        )
        assert episodes.num_rows == 4
        for row, want in zip(episodes.to_pylist(), meta, strict=True):
            for key in ("episode_index", "tasks", "length", "dataset_from_index"):
                assert row[key] == want[key]
            for camera in CAMERAS:
                column = column_name(camera)
                assert row[f"{column}__from_timestamp"] == want[f"videos/{camera}/from_timestamp"]
                assert row[f"{column}__to_timestamp"] == want[f"videos/{camera}/to_timestamp"]
                mp4 = dataset / (
                    f"videos/{camera}/chunk-000/file-{want[f'videos/{camera}/file_index']:03d}.mp4"
                )
                with client.open(row[column]) as reader:
                    assert reader.read() == mp4.read_bytes()
        camera_field = client.table_schema(f"robots.{name}_episodes").field(column_name(CAMERAS[0]))
        assert is_file_field(camera_field)
        # Each MP4 uploaded once, however many episodes share it.
        assert len(objects(shared_lake.root / "data" / "objects")) - len(stored) == 4
        tasks = client.query_table(f"SELECT task_index, task FROM robots.{name}_tasks ORDER BY 1")
        assert tasks.to_pylist() == [{"task_index": i, "task": t} for i, t in enumerate(TASKS)]


def test_other_versions_are_refused_naming_the_version(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    old = write_dataset(tmp_path / "old", DatasetSpec(lengths=(2, 2), version="v2.1"))
    name = _name()
    with lake_sdk.Client(shared_lake.query.url) as client:
        with pytest.raises(InvalidDataset, match=r"'v2\.1'"):
            import_lerobot(
                client, old, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
            )
        with pytest.raises(lake_sdk.TableNotFound):
            client.table_schema(f"robots.{name}_frames")


def test_a_missing_video_or_existing_table_fails_before_anything(
    shared_lake: LakeCluster, dataset: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    (broken / f"videos/{CAMERAS[1]}/chunk-000/file-001.mp4").unlink()
    name = _name()
    with lake_sdk.Client(shared_lake.query.url) as client:
        with pytest.raises(InvalidDataset, match=r"file-001\.mp4"):
            import_lerobot(
                client, broken, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
            )
        with pytest.raises(lake_sdk.TableNotFound):
            client.table_schema(f"robots.{name}_episodes")
        import_lerobot(
            client, dataset, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
        )
        with pytest.raises(lake_sdk.TableExists):
            import_lerobot(
                client, dataset, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
            )
        assert (
            client.query_table(f"SELECT count(*) AS n FROM robots.{name}_episodes")["n"][0].as_py()
            == 4
        )


def test_cli_imports_with_json_output(shared_lake: LakeCluster, dataset: Path) -> None:
    result = CliRunner().invoke(
        import_group,
        [
            "lerobot",
            str(dataset),
            "--namespace",
            "robots",
            "--addr",
            shared_lake.query.url,
            "--meta-addr",
            shared_lake.meta.addr,
            "--output",
            "json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    assert done["frames"] == "robots.pick_place_frames"
    assert done["episode_count"] == 4
    with lake_sdk.Client(shared_lake.query.url) as client:
        assert (
            client.query_table("SELECT count(*) AS n FROM robots.pick_place_frames")["n"][0].as_py()
            == 14
        )


def test_an_interrupted_import_resumes_without_uploading_again(
    shared_lake: LakeCluster, dataset: Path, tmp_path: Path
) -> None:
    name = _name()
    checkpoints = tmp_path / "checkpoints"
    stored = objects(shared_lake.root / "data" / "objects")
    script = (
        "import sys, lake_sdk\n"
        "from lake_sdk.lerobot import import_lerobot\n"
        "with lake_sdk.Client(sys.argv[1], upload_checkpoint_dir=sys.argv[2],"
        " progress=False) as c:\n"
        "    import_lerobot(c, sys.argv[3], namespace='robots', name=sys.argv[4],"
        " meta_addr=sys.argv[5])\n"
    )
    args = [shared_lake.query.url, str(checkpoints), str(dataset), name, shared_lake.meta.addr]
    env = {**os.environ, "LAKE_FAULTS": LEROBOT_AFTER_VIDEO_UPLOAD}
    crashed = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, timeout=120
    )
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr.decode()[-2000:]
    # The crash came after the frames and the first MP4, before the episodes.
    assert len(objects(shared_lake.root / "data" / "objects")) - len(stored) == 1
    assert list((checkpoints / "lerobot").glob("*.json"))
    with lake_sdk.Client(shared_lake.query.url, upload_checkpoint_dir=checkpoints) as client:
        count = f"SELECT count(*) AS n FROM robots.{name}_"
        assert client.query_table(count + "frames")["n"][0].as_py() == 14
        assert client.query_table(count + "episodes")["n"][0].as_py() == 0
        done = import_lerobot(
            client, dataset, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
        )
        assert (done.episode_count, done.frame_count) == (4, 14)
        # Nothing uploaded twice, nothing appended twice.
        assert len(objects(shared_lake.root / "data" / "objects")) - len(stored) == 4
        assert client.query_table(count + "frames")["n"][0].as_py() == 14
        source = pa.concat_tables(
            pq.read_table(p) for p in sorted(dataset.glob("data/chunk-*/file-*.parquet"))
        )
        frames = client.query_table(f"SELECT * FROM robots.{name}_frames ORDER BY index")
        assert frames.rename_columns(source.column_names).to_pylist() == source.to_pylist()
        episodes = client.query_table(f"SELECT * FROM robots.{name}_episodes ORDER BY 1")
        assert episodes.column("episode_index").to_pylist() == [0, 1, 2, 3]
        for row in episodes.to_pylist():
            for camera in CAMERAS:
                with client.open(row[column_name(camera)]) as reader:
                    assert reader.read()  # every FILE value reads, size and SHA-256 checked
        assert client.query_table(count + "tasks")["n"][0].as_py() == len(TASKS)
        # Finished: the journal is gone, and importing again is refused as before.
        assert not list((checkpoints / "lerobot").glob("*.json"))
        with pytest.raises(lake_sdk.TableExists):
            import_lerobot(
                client, dataset, namespace="robots", name=name, meta_addr=shared_lake.meta.addr
            )
