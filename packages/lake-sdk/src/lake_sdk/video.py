"""Frames of a FILE video at given timestamps, decoded by seeking through ``open_file``.

Needs the ``video`` extra (PyAV, with FFmpeg inside its wheel; without it,
importing this module raises :class:`~lake_sdk.errors.MissingExtra` naming the
``pip install`` to run). Only the bytes the demuxer asks for are fetched:
the container index, then from the keyframe before each timestamp up to the
frame shown at it::

    import lake_sdk
    from lake_sdk.video import frames

    with lake_sdk.Client("grpc://127.0.0.1:50051") as client:
        table = client.query_table("SELECT video FROM robots.episodes LIMIT 1")
        location = lake_sdk.data_location(table, "video", 0)
        result = frames(client, location, [0.5, 12.0, 31.25])
        images = [frame.to_ndarray(format="rgb24") for frame in result.frames]
        print(result.bytes_fetched, "of", location.size_bytes, "bytes fetched")
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lake_core.errors import InvalidArgument
from lake_core.models import DataLocation
from lake_sdk._client import AsyncClient
from lake_sdk._frames import require_extra
from lake_sdk._object_file import ObjectFile
from lake_sdk._sync import Client

require_extra("av", "video", "video frames from Lake")
import av  # noqa: E402  (after the check above, which names the install)
import av.container  # noqa: E402
import av.video.stream  # noqa: E402

__all__ = ["Frames", "decode_frames", "frames", "frames_async"]

#: Frame times within this of a timestamp count as at it (float seconds from pts).
_TOLERANCE_S = 1e-6


@dataclass(frozen=True)
class Frames:
    """The frame shown at each requested timestamp (same order), and what it cost."""

    frames: list[av.VideoFrame]
    bytes_fetched: int
    size_bytes: int


def _timestamps(values: Iterable[float]) -> list[float]:
    out: list[float] = []
    for value in values:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidArgument(f"a timestamp is a finite number of seconds, got {value!r}")
        if value < 0:
            raise InvalidArgument(f"a timestamp cannot be negative, got {value!r}")
        out.append(float(value))
    if not out:
        raise InvalidArgument("frames needs at least one timestamp")
    return out


def frames(
    client: Client, location: DataLocation, timestamps: Iterable[float], **options: Any
) -> Frames:
    """Decode the frame shown at each timestamp (seconds) of the video ``location``.

    ``options`` go to :meth:`~lake_sdk.Client.open_file` (``block_size``,
    ``cache_bytes``, ``read_ahead``, ``ttl``).
    """
    wanted = _timestamps(timestamps)
    with client.open_file(location, **options) as file:
        return Frames(decode_frames(file, wanted), file.bytes_fetched, location.size_bytes)


async def frames_async(
    client: AsyncClient, location: DataLocation, timestamps: Iterable[float], **options: Any
) -> Frames:
    """:func:`frames` for an :class:`~lake_sdk.AsyncClient`: decodes on a worker thread."""
    wanted = _timestamps(timestamps)
    file = await client.open_file(location, **options)
    try:
        decoded = await asyncio.to_thread(decode_frames, file, wanted)
    finally:
        await asyncio.to_thread(file.close)
    return Frames(decoded, file.bytes_fetched, location.size_bytes)


def decode_frames(source: ObjectFile | str, timestamps: Sequence[float]) -> list[av.VideoFrame]:
    """The frame shown at each timestamp: the last frame whose time is at or before it.

    Works on any file PyAV opens (an :class:`~lake_sdk.ObjectFile` or a local
    path). Each timestamp seeks to the keyframe at or before it and decodes
    forward; a timestamp before the first frame gives the first frame, one
    after the last gives the last.
    """
    container = av.open(source, mode="r")
    try:
        if not container.streams.video:
            raise InvalidArgument("the object has no video stream")
        stream = container.streams.video[0]
        by_time = {t: _frame_at(container, stream, t) for t in sorted(set(timestamps))}
    finally:
        container.close()
    return [by_time[t] for t in timestamps]


def _frame_at(
    container: av.container.InputContainer, stream: av.video.stream.VideoStream, t: float
) -> av.VideoFrame:
    base = stream.time_base
    if base is None:
        raise InvalidArgument("the video stream has no time base")
    container.seek(int(t / base), stream=stream, backward=True, any_frame=False)
    previous: av.VideoFrame | None = None
    for frame in container.decode(stream):
        if frame.time is not None and frame.time > t + _TOLERANCE_S:
            return previous if previous is not None else frame
        previous = frame
    if previous is None:
        raise InvalidArgument(f"the video has no frame at or after {t} s")
    return previous
