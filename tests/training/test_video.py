"""lake_sdk.video: frames at timestamps of a >= 100 MB H.264 video, seeking through open_file."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import lake_sdk
from lake_sdk import InvalidArgument
from lake_sdk.video import decode_frames, frames
from tests.training.open_file_support import Stage, store_file
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
