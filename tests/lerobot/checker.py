"""Every requirement FINDINGS lists for a LeRobot v3.0 dataset, checked without lerobot.

FINDINGS ("Robot data formats and engines"): ``meta/info.json`` (codebase_version
"v3.0", fps, counts, the path templates, features incl. timestamp, frame_index,
episode_index, index, task_index); ``meta/tasks.parquet`` with the task text as
the pandas index; ``meta/episodes`` rows with dataset_from_index,
dataset_to_index, data/chunk_index, data/file_index and per video key
chunk_index, file_index, from_timestamp, to_timestamp; one data row per frame;
videos with several episodes per file where a frame's time is
from_timestamp + timestamp, matched within 1e-4 s, so timestamps must be
exactly frame/fps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
REQUIRED_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
TOLERANCE_S = 1e-4


def decoded_frames(path: Path) -> list[tuple[float, np.ndarray]]:
    """Every frame of an MP4: (time in seconds, rgb24 pixels)."""
    import av

    with av.open(str(path)) as container:
        return [
            (float(frame.time), frame.to_ndarray(format="rgb24"))
            for frame in container.decode(video=0)
        ]


def frame_at(frames: list[tuple[float, np.ndarray]], t: float) -> np.ndarray:
    matches = [pixels for time, pixels in frames if abs(time - t) <= TOLERANCE_S]
    assert len(matches) == 1, f"no single frame within {TOLERANCE_S} s of {t}"
    return matches[0]


def check_dataset(root: Path) -> dict[str, Any]:
    """Assert every FINDINGS requirement; return what was read (for value comparisons)."""
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    fps = info["fps"]
    assert isinstance(fps, int)
    assert fps > 0
    assert info["data_path"] == DATA_PATH
    features = info["features"]
    video_keys = [k for k, f in features.items() if f["dtype"] == "video"]
    if video_keys:
        assert info["video_path"] == VIDEO_PATH
    for name in REQUIRED_FEATURES:
        assert name in features, name

    tasks = pd.read_parquet(root / "meta/tasks.parquet")
    assert all(isinstance(t, str) for t in tasks.index), "task text must be the pandas index"
    assert list(tasks["task_index"]) == list(range(len(tasks)))
    assert info["total_tasks"] == len(tasks)

    episodes = pa.concat_tables(
        pq.read_table(p) for p in sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    ).to_pylist()
    required = ["dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index"]
    for key in video_keys:
        required += [
            f"videos/{key}/{c}"
            for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
        ]
    for row in episodes:
        for column in required:
            assert column in row, column
            assert row[column] is not None, column
    assert [e["episode_index"] for e in episodes] == list(range(len(episodes)))
    assert info["total_episodes"] == len(episodes)

    frames: list[dict[str, Any]] = []
    for path in sorted(
        {
            root
            / DATA_PATH.format(chunk_index=e["data/chunk_index"], file_index=e["data/file_index"])
            for e in episodes
        }
    ):
        assert path.is_file(), path
        frames += pq.read_table(path).to_pylist()
    frames.sort(key=lambda f: f["index"])
    assert [f["index"] for f in frames] == list(range(len(frames)))
    assert info["total_frames"] == len(frames)
    position = 0
    videos: dict[Path, list[tuple[float, np.ndarray]]] = {}
    pictures: dict[tuple[str, int], list[np.ndarray]] = {}
    for episode in episodes:
        low, high = episode["dataset_from_index"], episode["dataset_to_index"]
        assert low == position, episode
        assert high - low == episode["length"], episode
        position = high
        mine = frames[low:high]
        for k, frame in enumerate(mine):
            assert frame["episode_index"] == episode["episode_index"]
            assert frame["frame_index"] == k
            # Exactly frame/fps, as a float32 value: LeRobot matches video times within 1e-4 s.
            assert frame["timestamp"] == float(np.float32(k / fps))
            assert 0 <= frame["task_index"] < len(tasks)
        for key in video_keys:
            video = root / VIDEO_PATH.format(
                video_key=key,
                chunk_index=episode[f"videos/{key}/chunk_index"],
                file_index=episode[f"videos/{key}/file_index"],
            )
            assert video.is_file(), video
            if video not in videos:
                videos[video] = decoded_frames(video)
            start = episode[f"videos/{key}/from_timestamp"]
            end = episode[f"videos/{key}/to_timestamp"]
            shots = []
            for frame in mine:
                t = start + frame["timestamp"]
                assert start - TOLERANCE_S <= t < end, (t, start, end)
                shots.append(frame_at(videos[video], t))
            pictures[(key, episode["episode_index"])] = shots
    assert position == len(frames)
    stats = (
        json.loads((root / "meta/stats.json").read_text())
        if (root / "meta/stats.json").exists()
        else None
    )
    return {
        "info": info,
        "tasks": list(tasks.index),
        "episodes": episodes,
        "frames": frames,
        "pictures": pictures,
        "stats": stats,
    }
