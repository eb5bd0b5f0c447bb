"""Test videos: H.264 noise, fast to encode, big for their length, a keyframe every second.

Noise does not compress, so a small picture at a high quality makes a large
file quickly (x264's ultrafast preset, no B-frames). Every frame carries its
index in a corner block, so a wrong frame never looks right.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["encode_noise_video", "pad_mp4"]


def encode_noise_video(
    path: Path,
    min_bytes: int,
    *,
    width: int = 160,
    height: int = 120,
    fps: int = 10,
    seed: int = 0,
) -> float:
    """Write an MP4 of at least ``min_bytes`` (whole seconds of it) and return its duration."""
    import av
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = height * 3 // 2  # yuv420p: a luma plane, then the two chroma planes
    pool = [rng.integers(0, 256, (rows, width), dtype=np.uint8) for _ in range(7)]
    written = 0
    frames = 0
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {
            "preset": "ultrafast",
            "g": str(fps),
            "keyint_min": str(fps),
            "sc_threshold": "0",
            "qp": "8",
        }
        while written < min_bytes or frames % fps:
            picture = np.roll(pool[frames % len(pool)], frames, axis=1)
            picture[:16, :16] = frames % 256
            picture[16:32, :16] = (frames // 256) % 256
            frame = av.VideoFrame.from_ndarray(picture, format="yuv420p")
            for packet in stream.encode(frame):
                written += packet.size
                out.mux(packet)
            frames += 1
        for packet in stream.encode():
            out.mux(packet)
    return frames / fps


def _top_level_boxes(data: bytes) -> list[tuple[bytes, int, int]]:
    """(type, offset, size) of each top-level ISO BMFF box of ``data``."""
    boxes, offset = [], 0
    while offset < len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        kind = data[offset + 4 : offset + 8]
        if size == 1:
            size = int.from_bytes(data[offset + 8 : offset + 16], "big")
        elif size == 0:
            size = len(data) - offset
        if size < 8:
            raise ValueError(f"malformed MP4 box at byte {offset}")
        boxes.append((kind, offset, size))
        offset += size
    return boxes


def pad_mp4(source: Path, target: Path, pad_bytes: int) -> int:
    """Copy ``source`` with a ``free`` box of ``pad_bytes`` between its media data and its index.

    The video stays valid and plays the same (players skip ``free`` boxes),
    but a player must read the index (``moov``) from past the padding: a file
    of any size whose playback and seeks touch only its two ends. The padding
    is a hole in a sparse file, so a 2 GiB video costs no disk until copied.
    Needs the index after the media data, as PyAV's MP4 muxer writes it.
    Returns the target's size.
    """
    data = source.read_bytes()
    boxes = _top_level_boxes(data)
    kinds = [kind for kind, _, _ in boxes]
    if b"moov" not in kinds or b"mdat" not in kinds or kinds.index(b"moov") < kinds.index(b"mdat"):
        raise ValueError("pad_mp4 needs an MP4 whose moov box follows its mdat box")
    split = boxes[kinds.index(b"moov")][1]
    box = 16 + pad_bytes  # a 64-bit size: the box may pass 4 GiB
    with target.open("wb") as out:
        out.write(data[:split])
        out.write((1).to_bytes(4, "big") + b"free" + box.to_bytes(8, "big"))
        out.seek(pad_bytes, 1)  # a hole: reads as zeros, stores nothing
        out.write(data[split:])
    return target.stat().st_size
