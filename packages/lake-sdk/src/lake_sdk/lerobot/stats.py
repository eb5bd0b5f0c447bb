"""``meta/stats.json`` numbers as LeRobot computes them, without LeRobot.

Numeric frame features: per element min, max, mean, std and count over every
exported frame (:class:`FrameStats`, fed batch by batch).

Video features, as LeRobot's ``compute_episode_stats``: per episode, sample
frames (every frame up to 100, then ``len ** 0.75`` of them, at most 10,000,
evenly spaced), downsample pictures of 300 pixels or more to about 150,
take per channel min, max, mean and std of the 0..255 pixels over the
samples, divided by 255, shaped (3, 1, 1); ``count`` is the number of
sampled frames. :func:`episode_video_stats` decodes an MP4 once (PyAV) for
all the episodes it holds; import stores the result per episode, and export
aggregates the selected episodes' stats as LeRobot's ``aggregate_stats``
does (count-weighted mean, pooled variance), so it decodes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "STAT_NAMES",
    "FrameStats",
    "VideoStats",
    "aggregate_video_stats",
    "episode_video_stats",
    "sample_indices",
]

#: The per-channel statistics stored per episode and camera.
STAT_NAMES = ("min", "max", "mean", "std")
_MIN_SAMPLES = 100
_MAX_SAMPLES = 10_000
_SAMPLE_POWER = 0.75
#: Pictures at least this wide or high are downsampled to about _TARGET_SIZE first.
_DOWNSAMPLE_FROM = 300
_TARGET_SIZE = 150
#: A decoded frame matches a frame timestamp within this (LeRobot's tolerance).
_TOLERANCE_S = 1e-4


class FrameStats:
    """Running min, max, sum, sum of squares and count per numeric feature (per element)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}

    def add(self, name: str, column: pa.ChunkedArray | pa.Array) -> None:
        kind = column.type
        if pa.types.is_fixed_size_list(kind):
            width = kind.list_size
            flat = pc.list_flatten(column)
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            width = 1
            flat = column
        else:
            return  # strings, variable-length lists: no per-element statistics
        rows = len(flat) // width if width else 0
        if rows == 0:
            return
        import numpy as np

        values = np.asarray(pc.cast(flat, pa.float64())).reshape(rows, width)
        entry = self.values.setdefault(
            name,
            {
                "min": np.full(width, math.inf),
                "max": np.full(width, -math.inf),
                "sum": np.zeros(width),
                "sq": np.zeros(width),
                "count": 0,
            },
        )
        entry["min"] = np.minimum(entry["min"], values.min(axis=0))
        entry["max"] = np.maximum(entry["max"], values.max(axis=0))
        entry["sum"] += values.sum(axis=0)
        entry["sq"] += (values * values).sum(axis=0)
        entry["count"] += rows

    def result(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, e in self.values.items():
            n = e["count"]
            mean = [float(s) / n for s in e["sum"]]
            std = [
                math.sqrt(max(0.0, float(q) / n - m * m))
                for q, m in zip(e["sq"], mean, strict=True)
            ]
            out[name] = {
                "min": [float(v) for v in e["min"]],
                "max": [float(v) for v in e["max"]],
                "mean": mean,
                "std": std,
                "count": [n],
            }
        return out


def sample_indices(length: int) -> list[int]:
    """LeRobot's evenly spaced sample of an episode's frame positions."""
    if length <= 0:
        return []
    low = min(_MIN_SAMPLES, length)
    count = max(low, min(int(length**_SAMPLE_POWER), _MAX_SAMPLES))
    if count == 1:
        return [0]
    step = (length - 1) / (count - 1)
    # np.round(np.linspace(...)) rounds half to even; so does Python's round().
    return sorted({round(i * step) for i in range(count)})


@dataclass(frozen=True)
class VideoStats:
    """One episode's (or an aggregate's) per-channel statistics of one camera, in 0..1."""

    min: tuple[float, ...]
    max: tuple[float, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    count: int

    def as_json(self) -> dict[str, Any]:
        """stats.json's shape for a video feature: (3, 1, 1) lists, count as [n]."""
        out: dict[str, Any] = {name: [[[v]] for v in getattr(self, name)] for name in STAT_NAMES}
        out["count"] = [self.count]
        return out


class _Running:
    """Per-channel sums over sampled pictures (uint8, height x width x channels)."""

    def __init__(self) -> None:
        self.count = 0
        self.pixels = 0
        self.sum: Any = None
        self.sq: Any = None
        self.min: Any = None
        self.max: Any = None

    def add(self, picture: Any) -> None:
        import numpy as np

        height, width = picture.shape[:2]
        if max(height, width) >= _DOWNSAMPLE_FROM:
            factor = int((width if width > height else height) / _TARGET_SIZE)
            picture = picture[::factor, ::factor]
        flat = picture.reshape(-1, picture.shape[2]).astype(np.float64)
        low, high = flat.min(axis=0), flat.max(axis=0)
        if self.sum is None:
            self.sum, self.sq = flat.sum(axis=0), (flat * flat).sum(axis=0)
            self.min, self.max = low, high
        else:
            self.sum += flat.sum(axis=0)
            self.sq += (flat * flat).sum(axis=0)
            self.min, self.max = np.minimum(self.min, low), np.maximum(self.max, high)
        self.count += 1
        self.pixels += flat.shape[0]

    def result(self) -> VideoStats | None:
        if self.count == 0:
            return None
        mean = [float(s) / self.pixels for s in self.sum]
        std = [
            math.sqrt(max(0.0, float(q) / self.pixels - m * m))
            for q, m in zip(self.sq, mean, strict=True)
        ]
        return VideoStats(
            tuple(float(v) / 255.0 for v in self.min),
            tuple(float(v) / 255.0 for v in self.max),
            tuple(m / 255.0 for m in mean),
            tuple(s / 255.0 for s in std),
            self.count,
        )


def episode_video_stats(
    path: Path, episodes: Sequence[tuple[float, int]], fps: int
) -> list[VideoStats | None]:
    """Stats of each episode (its from_timestamp, length) that the MP4 at ``path`` holds.

    Decodes the file once, in order; a sampled frame is the decoded frame at
    ``from_timestamp + frame / fps`` (within 1e-4 s, as LeRobot matches).
    """
    import av

    wanted: list[tuple[float, int]] = []  # (time, episode position), sorted by time
    for position, (start, length) in enumerate(episodes):
        wanted += [(start + k / fps, position) for k in sample_indices(length)]
    wanted.sort()
    running = [_Running() for _ in episodes]
    cursor = 0
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            if cursor >= len(wanted):
                break
            if frame.time is None:
                continue
            time = float(frame.time)
            while cursor < len(wanted) and wanted[cursor][0] < time - _TOLERANCE_S:
                cursor += 1  # no frame at that time: nothing to sample
            picture = None
            while cursor < len(wanted) and abs(wanted[cursor][0] - time) <= _TOLERANCE_S:
                if picture is None:
                    picture = frame.to_ndarray(format="rgb24")
                running[wanted[cursor][1]].add(picture)
                cursor += 1
    return [r.result() for r in running]


def aggregate_video_stats(parts: Sequence[VideoStats]) -> VideoStats:
    """LeRobot's aggregate: global min/max, count-weighted mean, pooled variance."""
    total = sum(p.count for p in parts)
    channels = len(parts[0].mean)
    mean = [sum(p.mean[c] * p.count for p in parts) / total for c in range(channels)]
    variance = [
        sum((p.std[c] ** 2 + (p.mean[c] - mean[c]) ** 2) * p.count for p in parts) / total
        for c in range(channels)
    ]
    return VideoStats(
        tuple(min(p.min[c] for p in parts) for c in range(channels)),
        tuple(max(p.max[c] for p in parts) for c in range(channels)),
        tuple(mean),
        tuple(math.sqrt(v) for v in variance),
        total,
    )
