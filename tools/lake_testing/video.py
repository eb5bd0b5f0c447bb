"""Test videos: H.264 noise, fast to encode, big for their length, a keyframe every second.

Noise does not compress, so a small picture at a high quality makes a large
file quickly (x264's ultrafast preset, no B-frames). Every frame carries its
index in a corner block, so a wrong frame never looks right.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["encode_noise_video"]


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
