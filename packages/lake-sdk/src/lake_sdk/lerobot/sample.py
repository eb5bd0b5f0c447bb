"""Tiny LeRobot v3.0 datasets written with pyarrow and PyAV (never with ``lerobot``).

For tests, docs and ``lake demo``; needs PyAV and numpy (``lake-sdk[lerobot]``).

The layout follows FINDINGS ("Robot data formats and engines"): ``meta/info.json``,
``meta/tasks.parquet`` (task text as the pandas index), ``meta/episodes/...``,
``data/chunk-000/file-NNN.parquet`` and ``videos/<key>/chunk-000/file-NNN.mp4``
holding several episodes each (H.264). As LeRobot writes them, each episode
is encoded on its own and the episodes are concatenated by a stream copy, so
every episode starts with a keyframe; ``DatasetSpec(episode_keyframes=False)``
encodes a file's episodes as one stream instead (a file not written LeRobot's
way). ``b_frames``, ``gop`` and ``open_gop`` shape the encoder's GOPs (B-frames:
packets out of presentation order). Every frame's picture encodes its episode and frame index, and its state
and action values derive from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lake_sdk.lerobot.exporter import write_tasks

CAMERAS = ("observation.images.front", "observation.images.wrist")
TASKS = ("pick the red block", "place it in the bin")
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


@dataclass(frozen=True)
class DatasetSpec:
    lengths: tuple[int, ...] = (4, 3, 5, 2)
    fps: int = 10
    size: int = 32
    episodes_per_file: int = 2
    version: str = "v3.0"
    #: Fill pictures with noise (big videos, for benchmarks); flat colours otherwise.
    noise: bool = False
    #: info.json's file limits (LeRobot's defaults).
    chunks_size: int = 1000
    data_files_size_in_mb: float = 100
    video_files_size_in_mb: float = 500
    #: Encode each episode on its own (LeRobot's way); False: one stream per file.
    episode_keyframes: bool = True
    #: The encoder's B-frames between references (``bf``); 0: I and P frames only. Episodes
    #: encoded on their own need ``b_frames + 1`` frames or more each (one decoding delay).
    b_frames: int = 0
    #: Frames per GOP (``g``); None: 2 per episode, or one GOP per file when
    #: ``episode_keyframes`` is False.
    gop: int | None = None
    #: Open GOPs (x264's ``open-gop``): B-frames after a keyframe in decode order
    #: may come before it in time and refer to the GOP before it.
    open_gop: bool = False


def _picture(episode: int, frame: int, camera: int, size: int, noise: bool = False) -> Any:
    import numpy as np

    if noise:
        rng = np.random.default_rng(episode * 100_003 + frame * 7 + camera)
        return rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    picture = np.zeros((size, size, 3), dtype=np.uint8)
    picture[:, :, 0] = (episode * 40 + camera * 100) % 256
    picture[:, :, 1] = (frame * 25) % 256
    picture[: size // 2, : size // 2, 2] = 200
    return picture


def _encode(target: Any, pictures: list[Any], fps: int, size: int, spec: DatasetSpec) -> None:
    import av

    gop = spec.gop or (2 if spec.episode_keyframes else 1000)
    options: dict[str, object] = {"preset": "ultrafast", "g": str(gop), "bf": str(spec.b_frames)}
    if spec.open_gop:
        # Keyframes exactly every ``gop`` frames, so the test knows where they are.
        options["x264-params"] = f"open-gop=1:keyint={gop}:min-keyint={gop}:scenecut=0"
    with av.open(target, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = options
        for picture in pictures:
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _write_video(path: Path, episodes: list[list[Any]], spec: DatasetSpec) -> None:
    """One MP4 of several episodes: each encoded alone and concatenated (as LeRobot does)."""
    import io

    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    if not spec.episode_keyframes:
        # One stream (by default with a single keyframe: later episodes do not start at one).
        _encode(
            str(path), [p for pictures in episodes for p in pictures], spec.fps, spec.size, spec
        )
        return
    parts = []
    for pictures in episodes:
        part = io.BytesIO()
        _encode(part, pictures, spec.fps, spec.size, spec)
        part.seek(0)
        parts.append(part)
    with av.open(str(path), "w", format="mp4") as out:
        stream = None
        offset = 0
        for part in parts:
            with av.open(part, "r") as source:
                template = source.streams.video[0]
                if stream is None:
                    stream = out.add_stream_from_template(template)
                    stream.time_base = template.time_base
                end = offset
                for packet in source.demux(template):
                    if packet.dts is None or packet.pts is None:
                        continue
                    packet.pts += offset
                    packet.dts += offset
                    end = max(end, packet.pts + (packet.duration or 0))
                    packet.stream = stream
                    out.mux(packet)
                offset = end


__all__ = ["CAMERAS", "TASKS", "DatasetSpec", "write_dataset"]


def write_dataset(root: Path, spec: DatasetSpec = DatasetSpec()) -> Path:
    """Write the dataset under ``root``; returns ``root``."""
    fps = spec.fps
    state_type = pa.list_(pa.float32(), 2)
    frames_schema = pa.schema(
        [
            ("observation.state", state_type),
            ("action", state_type),
            ("timestamp", pa.float32()),
            ("frame_index", pa.int64()),
            ("episode_index", pa.int64()),
            ("index", pa.int64()),
            ("task_index", pa.int64()),
        ]
    )
    files = [
        list(range(i, min(i + spec.episodes_per_file, len(spec.lengths))))
        for i in range(0, len(spec.lengths), spec.episodes_per_file)
    ]
    episodes: list[dict[str, object]] = []
    index = 0
    for file_index, members in enumerate(files):
        rows: dict[str, list[object]] = {name: [] for name in frames_schema.names}
        pictures: dict[str, list[list[Any]]] = {c: [] for c in CAMERAS}
        offset = 0
        for episode in members:
            length = spec.lengths[episode]
            start_index = index
            for camera in CAMERAS:
                pictures[camera].append([])
            for frame in range(length):
                rows["observation.state"].append([episode + frame / 10, -frame / 4])
                rows["action"].append([frame * 0.5, episode * 1.5])
                rows["timestamp"].append(frame / fps)
                rows["frame_index"].append(frame)
                rows["episode_index"].append(episode)
                rows["index"].append(index)
                rows["task_index"].append(episode % len(TASKS))
                for c, camera in enumerate(CAMERAS):
                    pictures[camera][-1].append(_picture(episode, frame, c, spec.size, spec.noise))
                index += 1
            record: dict[str, object] = {
                "episode_index": episode,
                "tasks": [TASKS[episode % len(TASKS)]],
                "length": length,
                "data/chunk_index": 0,
                "data/file_index": file_index,
                "dataset_from_index": start_index,
                "dataset_to_index": index,
            }
            for camera in CAMERAS:
                record[f"videos/{camera}/chunk_index"] = 0
                record[f"videos/{camera}/file_index"] = file_index
                record[f"videos/{camera}/from_timestamp"] = offset / fps
                record[f"videos/{camera}/to_timestamp"] = (offset + length) / fps
            record["meta/episodes/chunk_index"] = 0
            record["meta/episodes/file_index"] = 0
            episodes.append(record)
            offset += length
        data = root / DATA_PATH.format(chunk_index=0, file_index=file_index)
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(rows, schema=frames_schema), data)
        for camera in CAMERAS:
            video = root / VIDEO_PATH.format(video_key=camera, chunk_index=0, file_index=file_index)
            _write_video(video, pictures[camera], spec)
    meta = root / "meta"
    (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episodes), meta / "episodes/chunk-000/file-000.parquet")
    write_tasks(list(TASKS), meta / "tasks.parquet")
    video_feature = {
        "dtype": "video",
        "shape": [spec.size, spec.size, 3],
        "names": ["height", "width", "channels"],
        "info": {"video.fps": fps, "video.codec": "h264", "video.pix_fmt": "yuv420p"},
    }
    info = {
        "codebase_version": spec.version,
        "robot_type": "test_arm",
        "total_episodes": len(spec.lengths),
        "total_frames": index,
        "total_tasks": len(TASKS),
        "chunks_size": spec.chunks_size,
        "data_files_size_in_mb": spec.data_files_size_in_mb,
        "video_files_size_in_mb": spec.video_files_size_in_mb,
        "fps": fps,
        "splits": {"train": f"0:{len(spec.lengths)}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH,
        "features": {
            "observation.state": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
            "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
            **{camera: video_feature for camera in CAMERAS},
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": {"dtype": "int64", "shape": [1], "names": None},
            "episode_index": {"dtype": "int64", "shape": [1], "names": None},
            "index": {"dtype": "int64", "shape": [1], "names": None},
            "task_index": {"dtype": "int64", "shape": [1], "names": None},
        },
    }
    (meta / "info.json").write_text(json.dumps(info, indent=2))
    return root
