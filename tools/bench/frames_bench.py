"""Video frame access: a few frames of a big video by seeking, against downloading it first.

- ``frame_access``: 10 frames at random timestamps of a 1 GiB H.264 video on
  an S3 stage (SeaweedFS), decoded by ``lake_sdk.video.frames`` seeking
  through ``open_file``, against the same 10 frames decoded after a verified
  download of the whole object (``Client.open(...).copy_to``, size and SHA-256
  proved, as a reader without ranged access has to). Both sides decode with
  the same seeking decoder, at the same timestamps in the same round. The
  figure is the ratio of times; goal <= 0.2 (open_file at least 5x faster).
  ``bytes_fetched`` per sample is reported alongside, for context.

Quick mode: a 32 MiB video and few pairs (a smoke test, not a measurement).
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from lake_objects import FileUpload
from lake_sdk.video import decode_frames, frames
from tools.bench.harness import Figure, at_most, machine, measure, pairs_for, timed, warmup_for
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import start_meta, start_query
from tools.lake_testing.video import encode_noise_video

MIB = 1024 * 1024
BUCKET = "bench-frames"
FRAMES_PER_SAMPLE = 10
EPISODES = TableRef("robots", "episodes")
EPISODES_SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), file_field("video")])


@contextmanager
def _s3_lake(root: Path) -> Iterator[str]:
    """Metasrv and Query on an S3 stage; this process is the SDK, with the same identity."""
    s3 = SeaweedS3(root / "s3").start()
    saved = dict(os.environ)
    try:
        s3.create_bucket(BUCKET)
        os.environ.update(s3.env())
        env = {
            "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
            "LAKE_S3_BUCKET": BUCKET,
            "LAKE_MANAGED_OBJECT_PREFIX": "bench",
            **s3.env(),
        }
        meta = start_meta(root / "data", root, env=env)
        try:
            query = start_query(meta.addr, root, env=env)
            try:
                create_table(meta.addr, EPISODES, EPISODES_SCHEMA)
                yield query.url
            finally:
                query.stop()
        finally:
            meta.stop()
    finally:
        os.environ.clear()
        os.environ.update(saved)
        s3.stop()


def run(quick: bool) -> list[Figure]:
    size = 32 * MIB if quick else 1024 * MIB
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        video = root / "episode.mp4"
        duration = encode_noise_video(video, size)
        with _s3_lake(root) as url, lake_sdk.Client(url) as client:
            client.insert(
                "INSERT INTO robots.episodes (episode_id, video) VALUES (?, ?)",
                ["bench", FileUpload.from_path(video, "video/mp4")],
            )
            location = lake_sdk.data_location(
                client.query_table("SELECT video FROM robots.episodes"), "video", 0
            )
            rng = random.Random(7)
            sets: list[list[float]] = []
            fetched: list[int] = []

            def timestamps(i: int) -> list[float]:
                while len(sets) <= i:
                    sets.append([rng.uniform(0, duration) for _ in range(FRAMES_PER_SAMPLE)])
                return sets[i]

            calls = {"lake": 0, "reference": 0}

            def through_open_file() -> float:
                wanted = timestamps(calls["lake"])
                calls["lake"] += 1

                def work() -> None:
                    fetched.append(frames(client, location, wanted).bytes_fetched)

                return timed(work)

            def download_then_decode() -> float:
                wanted = timestamps(calls["reference"])
                calls["reference"] += 1
                copy = root / "download.mp4"

                def work() -> None:
                    with client.open(location) as reader:
                        reader.copy_to(copy)
                    decode_frames(str(copy), wanted)

                seconds = timed(work)
                copy.unlink()
                return seconds

            result = measure(
                "frame_access",
                through_open_file,
                download_then_decode,
                unit="s",
                goal=at_most(
                    0.2, "10 random frames via open_file >= 5x faster than download+decode"
                ),
                pairs=pairs_for(quick),
                warmup=warmup_for(quick),
            )
    median = sorted(fetched)[len(fetched) // 2]
    print(
        f"# frame_access: median {median / MIB:.1f} MiB fetched of {size / MIB:.0f} MiB per sample",
        file=sys.stderr,
    )
    return [result]


if __name__ == "__main__":
    print(machine())
    for figure in run(quick=False):
        print(figure.json())
