"""lake_sdk.video: frames at timestamps of a >= 100 MB H.264 video, seeking through open_file."""

from __future__ import annotations

import os
import random
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from lake_objects import FileUpload
from lake_sdk import InvalidArgument
from lake_sdk.video import decode_frames, frames
from tests.training.open_file_support import Stage, store_file
from tools.lake_testing.data import create_table
from tools.lake_testing.video import encode_noise_video

av = pytest.importorskip("av")  # the lake-sdk[video] extra; hatch's test env has it

MIB = 1024 * 1024
STAGES = [pytest.param("local"), pytest.param("s3", marks=pytest.mark.s3)]


@dataclass(frozen=True)
class Video:
    path: Path
    duration: float
    timestamps: list[float]
    expected: dict[float, np.ndarray]  # what a plain decode of the local file shows at each


def _shown_at(path: Path, timestamps: list[float]) -> dict[float, np.ndarray]:
    """Decode every frame of the local file in order: the last frame at or before each time."""
    pending = sorted(timestamps)
    shown: dict[float, np.ndarray] = {}
    previous = None
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            while pending and frame.time > pending[0] + 1e-6:
                shown[pending.pop(0)] = (previous or frame).to_ndarray()
            previous = frame
            if not pending:
                break
    for t in pending:
        shown[t] = previous.to_ndarray()
    return shown


@pytest.fixture(scope="session")
def video(tmp_path_factory: pytest.TempPathFactory) -> Video:
    path = tmp_path_factory.mktemp("video") / "episode.mp4"
    duration = encode_noise_video(path, 100 * MIB)
    rng = random.Random(19)
    timestamps = [0.0, round(duration - 0.05, 3)] + [
        round(rng.uniform(0, duration), 3) for _ in range(8)
    ]
    return Video(path, duration, timestamps, _shown_at(path, timestamps))


@pytest.fixture(params=STAGES)
def stage(request: pytest.FixtureRequest) -> Stage:
    found: Stage = request.getfixturevalue(f"{request.param}_stage")
    return found


def test_frames_at_ten_timestamps_equal_a_local_decode(stage: Stage, video: Video) -> None:
    assert video.path.stat().st_size >= 100 * MIB
    with lake_sdk.Client(stage.url) as client:
        location = store_file(client, video.path, f"video-{stage.kind}")
        result = frames(client, location, video.timestamps)
    assert len(result.frames) == 10
    for t, frame in zip(video.timestamps, result.frames, strict=True):
        assert frame.time <= max(t, 0) + 1e-6
        np.testing.assert_array_equal(frame.to_ndarray(), video.expected[t], err_msg=f"at {t} s")
    assert result.size_bytes == location.size_bytes
    assert 0 < result.bytes_fetched < location.size_bytes / 4, result.bytes_fetched


def test_decode_frames_agrees_with_a_local_path(video: Video) -> None:
    # The same seeking decode over the local file: the reference is not circular.
    local = decode_frames(str(video.path), video.timestamps)
    for t, frame in zip(video.timestamps, local, strict=True):
        np.testing.assert_array_equal(frame.to_ndarray(), video.expected[t], err_msg=f"at {t} s")


def test_bad_timestamps_fail_before_any_read(local_stage: Stage) -> None:
    with lake_sdk.Client(local_stage.url) as client:
        location = lake_sdk.DataLocation(
            uri="file:///nowhere", media_type="video/mp4", size_bytes=1, sha256="0" * 64
        )
        for bad in ([], [-1.0], [float("nan")], ["1"]):
            with pytest.raises(InvalidArgument):
                frames(client, location, bad)


def _section(heading: str) -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    body = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_the_docs_examples_run(local_stage: Stage, video: Video, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bundles = TableRef("robots", "bundles")
    create_table(
        local_stage.cluster.meta.addr,
        bundles,
        pa.schema([pa.field("episode_id", pa.utf8()), file_field("bundle")]),
    )
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("labels.json", '{"success": true}')
        out.writestr("depth.bin", os.urandom(3 * MIB))
    with lake_sdk.Client(local_stage.url) as client:
        client.insert(
            "INSERT INTO robots.bundles (episode_id, bundle) VALUES (?, ?)",
            ["ep-3", FileUpload.from_path(archive, "application/zip")],
        )
        store_file(client, video.path, "ep-7")
    blocks = _section("Reading files") + _section("Video frames")
    assert len(blocks) == 2
    for block in [*blocks, *blocks]:  # twice in a row, as a reader reruns a page
        code = block.replace("grpc://127.0.0.1:50051", local_stage.url)
        exec(compile(code, "docs/training.md", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    assert "of the video fetched" in printed
    assert int(printed.split()[0]) < archive.stat().st_size / 2  # bytes_fetched of the zip
