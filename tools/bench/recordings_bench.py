"""MCAP recordings: one second of one topic read in place, against mcap's reader on a local copy.

- ``mcap_window``: 1 s of ``/joint_states`` (at a random second) from a 60 s
  recording on an S3 stage (SeaweedFS), read by ``lake_sdk.mcap.messages``
  through ``open_file`` range reads, against the same window read by mcap's
  own seeking reader from a local copy of the file (no network at all: the
  floor). Report only: the ratio says what reading in place costs over a
  local disk.
- ``mcap_window_bytes``: bytes fetched per window as a fraction of the object,
  against the 5% budget (a computed bound, not a measured reference): goal
  <= 1.0 of the budget.

Full size: 60 s with a raw 30 Hz, 96 KiB camera topic (~170 MiB, as the
recording FINDINGS measured). Quick mode: 16 KiB frames at 20 Hz (~19 MiB).
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcap.reader import make_reader
from mcap.writer import CompressionType

import lake_sdk
from lake_core.names import TableRef
from lake_sdk.mcap import messages
from lake_sdk.recordings import recordings_schema
from tools.bench.harness import (
    Figure,
    at_most,
    figure,
    machine,
    measure,
    pairs_for,
    timed,
    warmup_for,
)
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.recordings import SECOND, T0, Spec, write_recording
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import start_meta, start_query

MIB = 1024 * 1024
BUDGET = 0.05
TABLE = TableRef("robots", "recordings")
TOPIC = "/joint_states"
BUCKET = "bench-recordings"


@contextmanager
def s3_lake(root: Path) -> Iterator[str]:
    """Metasrv and Query on an S3 stage with a recordings table; yields Query's URL."""
    s3 = SeaweedS3(root / "s3").start()
    saved = dict(os.environ)
    try:
        s3.create_bucket(BUCKET)
        os.environ.update(s3.env())  # this process is the SDK, with the same identity
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
                create_table(meta.addr, TABLE, recordings_schema())
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
    spec = Spec(
        seconds=60,
        joint_hz=100,
        event_hz=5,
        camera_hz=20 if quick else 30,
        camera_bytes=(16 if quick else 96) * 1024,
        chunk_size=(128 if quick else 1024) * 1024,
        compression=CompressionType.NONE,
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = write_recording(root / "minute.mcap", spec)
        size = path.stat().st_size
        with s3_lake(root) as url, lake_sdk.Client(url) as client:
            client.add_recording(TABLE, path)
            location = lake_sdk.data_location(
                client.query_table(f"SELECT recording FROM {TABLE}"), "recording", 0
            )
            rng = random.Random(11)
            seconds: list[int] = []
            fractions: list[float] = []
            calls = {"lake": 0, "reference": 0}

            def window(i: int) -> tuple[int, int]:
                while len(seconds) <= i:
                    seconds.append(rng.randrange(0, 59))
                start = T0 + seconds[i] * SECOND
                return start, start + SECOND

            def in_place() -> float:
                start, end = window(calls["lake"])
                calls["lake"] += 1
                got: list[int] = []

                def work() -> None:
                    with messages(client, location, topics=[TOPIC], start=start, end=end) as w:
                        got.extend(m.log_time_ns for m in w)
                    fractions.append(w.bytes_fetched / location.size_bytes)

                took = timed(work)
                assert len(got) == spec.joint_hz, len(got)
                return took

            def local_copy() -> float:
                start, end = window(calls["reference"])
                calls["reference"] += 1
                got: list[int] = []

                def work() -> None:
                    with path.open("rb") as f:
                        for _, _, message in make_reader(f).iter_messages(
                            topics=[TOPIC], starting_at=start, ending_before=end
                        ):
                            got.append(message.log_time)

                took = timed(work)
                assert len(got) == spec.joint_hz, len(got)
                return took

            timing = measure(
                "mcap_window",
                in_place,
                local_copy,
                unit="s",
                goal=None,
                pairs=pairs_for(quick),
                warmup=warmup_for(quick),
            )
    measured = fractions[-timing.pairs :]  # the warm-up round's window is not a sample
    bytes_figure = figure(
        "mcap_window_bytes",
        measured,
        [BUDGET] * len(measured),
        unit="fraction of the object",
        goal=at_most(1.0, "1 s of one topic of 60 s fetches <= 5% of the recording"),
        reference_kind="bound",
    )
    print(
        f"# mcap_window: median {sorted(fractions)[len(fractions) // 2]:.4f} of the object "
        f"fetched per window ({spec.seconds:.0f} s recording, {size / MIB:.0f} MiB)",
        file=sys.stderr,
    )
    return [timing, bytes_figure]


if __name__ == "__main__":
    print(machine())
    for result in run(quick=False):
        print(result.json())
