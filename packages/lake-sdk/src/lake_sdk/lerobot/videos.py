"""One camera's exported videos: whole source MP4s copied, or selected episodes cut out losslessly.

LeRobot v3.0 encodes each episode on its own and concatenates the episodes
into ``videos/<key>/chunk-C/file-F.mp4`` by a stream copy, so each episode's
packets start with a keyframe and decode without the packets before them.
For each camera, in episode order:

- a source MP4 every one of whose episodes is selected is copied whole
  (streamed from the stage, size and SHA-256 verified; the fast path, its
  episodes keep their from/to timestamps);
- otherwise each selected episode's packets are read through
  :meth:`~lake_sdk.AsyncClient.open_file` (range reads of the moov box and of
  that episode's samples only) and muxed, without re-encoding, into the
  camera's current output MP4, its timestamps moved to follow the episodes
  already there; the from/to timestamps move with them. A new output file
  starts when the episode would take the current one to info.json's
  ``video_files_size_in_mb`` or beyond (as :class:`~lake_sdk.lerobot.files.DataFiles`
  does for frames) or when its codec parameters differ.

A cut is made only when the episode's packets are provably its own: the
first, in decode order, is a keyframe at the episode's ``from_timestamp``;
there are exactly ``length`` of them, presented at ``from_timestamp + k/fps``;
the packet after them belongs to a later time. Otherwise (a file not written
LeRobot's way) that source file is copied whole instead and its remaining
selected episodes point into the copy, so no episode ever decodes wrong frames.

What a cut verifies: every range read returns exactly the bytes asked for,
and PyAV's demuxer parses the MP4's index and samples; the object's SHA-256
covers the whole object, so a partial read cannot check it (it is checked
when the reads happened to cover the whole object in order). One episode's
packets per camera are held in memory at a time, never a whole file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lake_core.models import DataLocation
from lake_sdk.errors import InvalidDataset
from lake_sdk.lerobot.files import VIDEO_FILE, next_slot

if TYPE_CHECKING:
    from lake_sdk._client import AsyncClient

__all__ = ["CameraVideos", "EpisodeVideo", "PlacedVideo", "export_camera"]

#: LeRobot matches a frame's time within this many seconds.
TOLERANCE_S = 1e-4
_MB = 1024 * 1024


@dataclass(frozen=True)
class EpisodeVideo:
    """One selected episode's window in one camera's source MP4."""

    location: DataLocation
    from_timestamp: float
    to_timestamp: float
    length: int


@dataclass(frozen=True)
class PlacedVideo:
    """Where an episode's video went: (chunk, file) and its window there."""

    chunk: int
    file: int
    from_timestamp: float
    to_timestamp: float


@dataclass(frozen=True)
class CameraVideos:
    placed: list[PlacedVideo]
    copied: int  # whole source files copied
    cut: int  # files written from cut episodes


def _signature(stream: Any) -> tuple[Any, ...]:
    """What must match for two episodes' packets to share one MP4 track."""
    context = stream.codec_context
    return (
        context.name,
        bytes(context.extradata or b""),
        context.width,
        context.height,
        context.format.name if context.format is not None else None,
        stream.time_base,
    )


class _Source:
    """A source MP4 opened through the SDK's seekable range reader (blocking: use in a thread)."""

    def __init__(self, location: DataLocation, file: Any) -> None:
        import av

        self.location = location
        self.file = file
        try:
            self.container = av.open(file, "r")
        except av.FFmpegError as exc:
            file.close()
            raise InvalidDataset(f"{location.uri!r} is not a readable MP4: {exc}") from None
        if not self.container.streams.video:
            self.close()
            raise InvalidDataset(f"{location.uri!r} holds no video stream")
        self.stream = self.container.streams.video[0]
        self.signature = _signature(self.stream)

    def segment(self, episode: EpisodeVideo, fps: int) -> list[Any] | None:
        """The episode's packets in decode order, or None if they cannot be cut out cleanly."""
        import av

        stream = self.stream
        time_base = stream.time_base
        start, end = episode.from_timestamp, episode.to_timestamp
        packets: list[Any] = []
        try:
            target = max(0, int((Fraction(start) - Fraction(TOLERANCE_S)) / time_base))
            self.container.seek(target, stream=stream, backward=True)
            for packet in self.container.demux(stream):
                if packet.pts is None or packet.dts is None or packet.size == 0:
                    continue
                at = float(packet.pts * time_base)
                if not packets:
                    if at < start - TOLERANCE_S:
                        continue  # the seek landed before the episode
                    if abs(at - start) > TOLERANCE_S or not packet.is_keyframe:
                        return None
                elif len(packets) == episode.length:
                    if at < end - TOLERANCE_S:
                        return None  # a frame of this window after the episode's packets
                    break
                packets.append(packet)
        except av.FFmpegError as exc:
            raise InvalidDataset(f"{self.location.uri!r} is not a readable MP4: {exc}") from None
        times = sorted(float(p.pts * time_base) for p in packets)
        expected = [start + k / fps for k in range(episode.length)]
        if len(times) != episode.length or any(
            abs(t - e) > TOLERANCE_S for t, e in zip(times, expected, strict=True)
        ):
            return None
        return packets

    def close(self) -> None:
        try:
            self.container.close()
        finally:
            self.file.close()


class _Output:
    """One output MP4 that cut episodes are appended to (blocking: use in a thread)."""

    def __init__(self, path: Path, slot: tuple[int, int], template: Any, fps: int) -> None:
        import av

        self.path = path
        self.slot = slot
        self.signature = _signature(template)
        self.time_base = template.time_base
        self.frame_ticks = max(1, round(1 / (fps * self.time_base)))
        self.bytes = 0
        self.cursor = 0  # where the next episode starts, in time_base units
        self.last_dts = -1
        path.parent.mkdir(parents=True, exist_ok=True)
        self.temporary = path.with_name(f".{path.name}.partial")
        self.container = av.open(str(self.temporary), "w", format="mp4")
        self.stream = self.container.add_stream_from_template(template)
        self.stream.time_base = template.time_base

    def add(self, packets: list[Any]) -> Fraction:
        """Append one episode's packets after what is there; the time of its first frame."""
        first = packets[0].pts
        lowest_dts = min(p.dts for p in packets)
        shift = max(self.cursor - first, self.last_dts + 1 - lowest_dts)
        end = self.cursor
        for packet in packets:
            packet.pts += shift
            packet.dts += shift
            end = max(end, packet.pts + (packet.duration or self.frame_ticks))
            self.last_dts = max(self.last_dts, packet.dts)
            self.bytes += packet.size
            packet.stream = self.stream
            self.container.mux(packet)
        self.cursor = end
        starts: Fraction = Fraction(first + shift) * Fraction(self.time_base)
        return starts

    def finish(self) -> None:
        self.container.close()
        os.replace(self.temporary, self.path)

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.container.close()
        with contextlib.suppress(FileNotFoundError):
            self.temporary.unlink()


async def export_camera(
    client: AsyncClient,
    key: str,
    episodes: list[EpisodeVideo],
    whole: set[str],
    *,
    root: Path,
    fps: int,
    chunks_size: int,
    limit_mb: float,
    copy: Callable[[DataLocation, Path], Awaitable[None]],
) -> CameraVideos:
    """Write one camera's videos for ``episodes`` (in order); ``whole``: SHA-256s to copy whole."""
    limit = limit_mb * _MB
    slot = (0, 0)
    placed: list[PlacedVideo] = []
    copies: dict[str, tuple[int, int]] = {}
    copying: list[asyncio.Future[None]] = []
    whole = set(whole)
    source: _Source | None = None
    output: _Output | None = None
    cut = 0

    def take() -> tuple[int, int]:
        nonlocal slot
        taken, slot = slot, next_slot(slot, chunks_size)
        return taken

    def path_of(at: tuple[int, int]) -> Path:
        return root / VIDEO_FILE.format(video_key=key, chunk_index=at[0], file_index=at[1])

    def copy_whole(episode: EpisodeVideo) -> PlacedVideo:
        sha = episode.location.sha256
        if sha not in copies:
            copies[sha] = at = take()
            copying.append(asyncio.ensure_future(copy(episode.location, path_of(at))))
        chunk, file = copies[sha]
        return PlacedVideo(chunk, file, episode.from_timestamp, episode.to_timestamp)

    async def close_source() -> None:
        nonlocal source
        if source is not None:
            closing, source = source, None
            await asyncio.to_thread(closing.close)

    try:
        for episode in episodes:
            sha = episode.location.sha256
            if sha in whole:
                placed.append(copy_whole(episode))
                continue
            if source is None or source.location.sha256 != sha:
                await close_source()
                file = await client.open_file(episode.location)
                source = await asyncio.to_thread(_Source, episode.location, file)
            packets = await asyncio.to_thread(source.segment, episode, fps)
            if packets is None:
                # Not cut at a keyframe (not written LeRobot's way): copy this file whole.
                whole.add(sha)
                placed.append(copy_whole(episode))
                continue
            size = sum(p.size for p in packets)
            if output is not None and (
                output.signature != source.signature or output.bytes + size >= limit
            ):
                finished, output = output, None
                await asyncio.to_thread(finished.finish)
            if output is None:
                at = take()
                output = await asyncio.to_thread(_Output, path_of(at), at, source.stream, fps)
                cut += 1
            starts = await asyncio.to_thread(output.add, packets)
            chunk, file_index = output.slot
            # The window keeps its length; it starts exactly at its first frame.
            window = Fraction(episode.to_timestamp) - Fraction(episode.from_timestamp)
            placed.append(PlacedVideo(chunk, file_index, float(starts), float(starts + window)))
        if output is not None:
            finished, output = output, None
            await asyncio.to_thread(finished.finish)
        await close_source()
        await asyncio.gather(*copying)
    except BaseException:
        for pending in copying:
            pending.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*copying, return_exceptions=True)
        if output is not None:
            await asyncio.to_thread(output.abandon)
        with contextlib.suppress(Exception):
            await close_source()
        raise
    return CameraVideos(placed, len(copies), cut)
