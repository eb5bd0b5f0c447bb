"""The console against the SDK doing the same read (``lake console``, issue 34).

- ``console_video_seek``: what a video player's seek costs through the
  console: the Range request it sends (``bytes=N-`` at a random offset, one
  4 MiB response read whole over HTTP), against the same 4 MiB range read
  by the SDK (``Client.open_range``) in this process. Goal <= 1.5x. The
  HTTP side reads as a browser's native network stack does
  (``RangeReader``: a kept-alive connection, ``recv_into`` one buffer
  allocated once, no Python header parsing beyond status and lengths):
  ``http.client`` spent more on parsing headers with ``email``, walking the
  cookie jar and allocating a fresh 4 MiB body per request than the console
  spends serving it. Both sides still receive all 4 MiB into their own
  memory (one copy each). Each pair compares the p50s of
  :data:`SEEK_BLOCK` interleaved seeks per side: one millisecond-scale
  call's jitter on this shared machine is larger than the effect measured.
- ``console_query_page``: the Query page of a 10,000-row result (its first
  50 rows rendered as the typed grid, HTML read whole over HTTP), against
  the SDK's ``query_table`` of the same statement. Goal <= 1.5x.

One Metasrv, one Query (local stage, no credentials: the console signs in
with an empty token) and one ``lake console`` process, all started and
stopped here by pid. Quick mode: an 8 MiB object and few pairs (a smoke run).
"""

from __future__ import annotations

import os
import random
import tempfile
import urllib.parse
from pathlib import Path

import pyarrow as pa

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from lake_objects import FileUpload
from lake_sdk.console.file_pages import encode_location
from lake_sdk.console.settings import RANGE_CHUNK_BYTES
from tools.bench.harness import Figure, at_most, machine, measure, pairs_for, timed, warmup_for
from tools.lake_testing.console import RangeReader, Session, start_console
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import start_meta, start_query

MIB = 1024 * 1024
ROWS = 10_000
VIDEOS = TableRef("robots", "videos")
VIDEOS_SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), file_field("video")])
SQL = f"SELECT * FROM {EPISODES} ORDER BY episode_id"
#: Seeks per side in one round of ``console_video_seek`` (full runs): a pair is two p50s.
SEEK_BLOCK = 9


def _random_file(path: Path, size: int) -> Path:
    with path.open("wb") as out:
        left = size
        while left:
            step = min(left, 4 * MIB)
            out.write(os.urandom(step))
            left -= step
    return path


def run(quick: bool) -> list[Figure]:
    size = 8 * MIB if quick else 512 * MIB
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {
            "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
            "LAKE_MANAGED_OBJECT_ROOT": str(root / "data" / "objects"),
        }
        meta = start_meta(root / "data", root, env=env)
        try:
            query = start_query(meta.addr, root, env=env)
            try:
                create_table(meta.addr, EPISODES, EPISODES_SCHEMA)
                create_table(meta.addr, VIDEOS, VIDEOS_SCHEMA)
                console = start_console(query.url, root)
                try:
                    return _measure(quick, query.url, console.url, root, size)
                finally:
                    console.stop()
            finally:
                query.stop()
        finally:
            meta.stop()


def _measure(quick: bool, query_url: str, console_url: str, root: Path, size: int) -> list[Figure]:
    video = _random_file(root / "episode.mp4", size)
    with lake_sdk.Client(query_url, connect_timeout=60, progress=False) as client:
        client.ingest(EPISODES, episodes(0, ROWS))
        client.insert(
            f"INSERT INTO {VIDEOS} (episode_id, video) VALUES (?, ?)",
            ["bench", FileUpload.from_path(video, "video/mp4")],
        )
        location = lake_sdk.data_location(
            client.query_table(f"SELECT video FROM {VIDEOS}"), "video", 0
        )
        session = Session(console_url)
        session.sign_in("")
        ranges = RangeReader(session, RANGE_CHUNK_BYTES)
        link = f"/file?loc={encode_location(location)}"
        rng = random.Random(7)
        offsets: list[int] = []

        def offset(i: int) -> int:
            while len(offsets) <= i:
                offsets.append(rng.randrange(0, size - RANGE_CHUNK_BYTES))
            return offsets[i]

        calls = {"lake": 0, "reference": 0}

        def console_seek() -> float:
            start = offset(calls["lake"])
            calls["lake"] += 1

            def work() -> None:
                assert len(ranges.get(link, start)) == RANGE_CHUNK_BYTES

            return timed(work)

        def sdk_range() -> float:
            start = offset(calls["reference"])
            calls["reference"] += 1

            def work() -> None:
                with client.open_range(location, start, start + RANGE_CHUNK_BYTES) as reader:
                    assert len(reader.read()) == RANGE_CHUNK_BYTES

            return timed(work)

        # One untimed request of each kind first, in quick runs too: the first
        # ones pay one-time costs (Query's and the console's cold paths).
        ranges.get(link, 0)
        session.request("/query?" + urllib.parse.urlencode({"sql": SQL}))
        try:
            seek = measure(
                "console_video_seek",
                console_seek,
                sdk_range,
                unit="s",
                goal=at_most(
                    1.5, "a seek's 4 MiB Range response via the console <= 1.5x the SDK's"
                ),
                pairs=pairs_for(quick),
                warmup=warmup_for(quick),
                block=1 if quick else SEEK_BLOCK,
            )
        finally:
            ranges.close()
        page_url = "/query?" + urllib.parse.urlencode({"sql": SQL})

        def console_page() -> float:
            def work() -> None:
                reply = session.request(page_url)
                assert reply.status == 200
                assert reply.text.count('data-testid="result-row"') == 50

            return timed(work)

        def sdk_table() -> float:
            return timed(lambda: client.query_table(SQL))

        page = measure(
            "console_query_page",
            console_page,
            sdk_table,
            unit="s",
            goal=at_most(1.5, "a 10,000-row result's first page rendered <= 1.5x query_table"),
            pairs=pairs_for(quick),
            warmup=warmup_for(quick),
        )
    return [seek, page]


if __name__ == "__main__":
    print(machine())
    for figure in run(quick=False):
        print(figure.json())
