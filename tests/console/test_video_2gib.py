"""A 2 GiB video plays and seeks in Chromium while the console reads only what is shown.

The video is a short H.264 clip with a 2 GiB ``free`` box between its media
data and its index (``tools.lake_testing.video.pad_mp4``), so the player must
fetch the index from past 2 GiB before the first frame, then seek. The
console serves each Range request through the SDK's store (a local stage's
range mapped from its file, no read() of it); the bytes its process reads
and writes (``rchar`` and ``wchar`` in ``/proc/PID/io``: files and sockets
alike, so every byte the browser got) stay a small fraction of the object.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from tests.console.conftest import FPS, TOKENS, Console
from tests.console.test_browser import by_id, seek, sign_in, wait
from tools.lake_testing.servers import LakeProcess
from tools.lake_testing.video import encode_noise_video, pad_mp4

pytestmark = pytest.mark.slow

BIG = TableRef("robots", "big_videos")
GIB = 1024**3
MIB = 1024**2
#: What the console may read while the browser opens and seeks the 2 GiB video.
READ_BUDGET = 64 * MIB


def read_bytes(pid: int, counter: str = "rchar") -> int:
    with open(f"/proc/{pid}/io") as io:
        return int(next(line for line in io if line.startswith(f"{counter}:")).split()[1])


@pytest.fixture(scope="module")
def big_video(lake: LakeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[float]:
    """robots.big_videos row 0: a 2 GiB video; yields its duration."""
    root = tmp_path_factory.mktemp("big-video")
    clip = root / "clip.mp4"
    duration = encode_noise_video(clip, 1_500_000, fps=FPS)
    padded = root / "padded.mp4"
    assert pad_mp4(clip, padded, 2 * GIB) > 2 * GIB
    schema = pa.schema([pa.field("id", pa.int64()), file_field("video")])
    with lake_sdk.Client(lake.url, token=TOKENS["acme"], connect_timeout=60, progress=False) as c:
        c.create_table(BIG.qualified, schema)
        c.insert(
            f"INSERT INTO {BIG.qualified} (id, video) VALUES (?, ?)",
            [0, lake_sdk.FileUpload.from_path(padded, "video/mp4")],
        )
        [location] = c.query_table(f"SELECT video FROM {BIG.qualified}").column(0).to_pylist()
    padded.unlink()
    stored = Path(urllib.parse.urlparse(location["uri"]).path)
    try:
        yield duration
    finally:
        # The other console tests list exactly their own tables; and 2 GiB of disk.
        with lake_sdk.Client(lake.url, token=TOKENS["acme"], progress=False) as c:
            c.drop_table(BIG.qualified)
        stored.unlink(missing_ok=True)


def test_a_2_gib_video_seeks_without_the_console_reading_it(
    browser: Any, console: Console, big_video: float
) -> None:
    sign_in(browser, console)
    before = read_bytes(console.proc.pid)
    written_before = read_bytes(console.proc.pid, "wchar")
    sql = f"SELECT id, video FROM {BIG.qualified}"
    browser.get(console.url + "/episode?" + urllib.parse.urlencode({"sql": sql, "row": "0"}))
    video = wait(browser).until(lambda d: d.find_elements(*by_id("video-player")))[0]
    wait(browser).until(lambda d: d.execute_script("return arguments[0].readyState >= 2", video))
    duration = browser.execute_script("return arguments[0].duration", video)
    assert abs(duration - big_video) < 1.0
    target = big_video * 0.75
    landed = seek(browser, video, target)
    assert abs(landed - target) <= 1 / FPS
    read = read_bytes(console.proc.pid) - before
    assert read < READ_BUDGET, f"the console read {read / MIB:.0f} MiB of a 2 GiB video"
    sent = read_bytes(console.proc.pid, "wchar") - written_before
    assert 0 < sent < READ_BUDGET, f"the console sent {sent / MIB:.0f} MiB of a 2 GiB video"
