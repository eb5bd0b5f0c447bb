"""Recordings without chunk indexes read in bounded memory, with the indexed path's results.

A recorder killed mid-file or a streamed recording has no summary to seek
by. Its messages are read through :class:`lake_sdk.mcap.Messages` over an
:class:`ObjectFile` on a local file (the same reader the clients use, without
servers), against the same messages written with chunk indexes.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcap.reader import make_reader
from mcap.writer import CompressionType, IndexType, Writer

from lake_core.models import DataLocation
from lake_sdk import ObjectFile
from lake_sdk._block_cache import CacheLimits
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap.read import Messages
from tools.lake_testing.loops import loop_on_thread
from tools.lake_testing.recordings import SECOND, T0, Spec, write_recording

MIB = 1024 * 1024
#: (indexed spec, the same messages without an index), by name.
PAIRS = {
    "chunked-zstd": (Spec(seconds=3, chunk_size=8 * 1024), {"summary": False}),
    "chunked-plain-summary": (
        Spec(seconds=3, chunk_size=4 * 1024, compression=CompressionType.NONE),
        {"indexes": False},
    ),
    "unchunked": (Spec(seconds=2, chunked=False), {"summary": False}),
}
WINDOWS = [
    (None, None, None),
    (["/joint_states"], T0, T0 + SECOND),
    (["/events"], None, T0 + SECOND // 2),
    (["/events", "/joint_states"], T0 + SECOND // 3, T0 + 2 * SECOND + 7),
    (["/nope"], None, None),
]


class FileRanges:
    """Ranges of a local file, served on the client's event loop."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def fetch(self, start: int, end: int) -> bytes:
        with self.path.open("rb") as file:
            file.seek(start)
            return file.read(end - start)

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    with loop_on_thread() as running:
        yield running


def open_messages(
    loop: asyncio.AbstractEventLoop,
    path: Path,
    topics: list[str] | None = None,
    start: int | None = None,
    end: int | None = None,
) -> Messages:
    sha = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(MIB):
            sha.update(block)
    location = DataLocation(
        uri=f"file://{path}",
        media_type="application/x-mcap",
        size_bytes=path.stat().st_size,
        sha256=sha.hexdigest(),
    )
    limits = CacheLimits.create(block_size=64 * 1024, cache_bytes=MIB)
    return Messages(ObjectFile(location, FileRanges(path), loop, limits), topics, start, end)


def read(loop: asyncio.AbstractEventLoop, path: Path, *window: object) -> list[tuple[object, ...]]:
    with open_messages(loop, path, *window) as messages:  # type: ignore[arg-type]
        return [
            (m.topic, m.log_time_ns, m.publish_time_ns, m.sequence, m.data, m.schema_name)
            for m in messages
        ]


def reference(path: Path, *window: object) -> list[tuple[object, ...]]:
    """What mcap's own reader gives on the local file (it may hold it whole: small files)."""
    topics, start, end = window
    with path.open("rb") as file:
        return [
            (c.topic, m.log_time, m.publish_time, m.sequence, m.data, s.name if s else "")
            for s, c, m in make_reader(file).iter_messages(
                topics=topics, starting_at=start, ending_before=end, log_time_order=True
            )
        ]


@pytest.mark.parametrize("name", list(PAIRS))
def test_unindexed_reads_equal_the_indexed_ones(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, name: str
) -> None:
    spec, without = PAIRS[name]
    indexed = write_recording(tmp_path / "indexed.mcap", spec)
    bare = write_recording(tmp_path / "bare.mcap", Spec(**{**spec.__dict__, **without}))
    assert indexed.read_bytes() != bare.read_bytes()
    for window in WINDOWS:
        want = read(loop, indexed, *window)
        assert want == reference(indexed, *window), window
        assert read(loop, bare, *window) == want, window
    assert read(loop, indexed, *WINDOWS[0])


def write_shuffled(path: Path, *, chunked: bool, indexed: bool, seed: int) -> Path:
    """Messages out of log-time order (late publishers, equal times): chunks overlap in time."""
    rng = random.Random(seed)
    options: dict[str, object] = {"chunk_size": 2048, "use_chunking": chunked}
    if not indexed:
        options.update(
            repeat_channels=False, repeat_schemas=False, use_statistics=False,
            use_summary_offsets=False, index_types=IndexType.NONE,
        )  # fmt: skip
    with path.open("wb") as out:
        writer = Writer(out, **options)  # type: ignore[arg-type]
        writer.start(profile="", library="lake-tests")
        schema = writer.register_schema("s", "jsonschema", b"{}")
        channels = [writer.register_channel(f"/t{k}", "json", schema) for k in range(3)]
        for i in range(600):
            t = T0 + i * 1000 + rng.choice([0, 0, -5000, 20_000, -200_000])
            t -= t % 2000 if i % 7 == 0 else 0  # equal log times on purpose
            writer.add_message(
                rng.choice(channels), log_time=t, data=b'{"i":%d}' % i, publish_time=t, sequence=i
            )
        writer.finish()
    return path


@pytest.mark.parametrize("chunked", [True, False])
def test_out_of_order_recordings_come_back_in_log_time_order(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, chunked: bool
) -> None:
    indexed = write_shuffled(tmp_path / "i.mcap", chunked=chunked, indexed=True, seed=3)
    bare = write_shuffled(tmp_path / "b.mcap", chunked=chunked, indexed=False, seed=3)
    for window in [*WINDOWS[:1], (["/t1"], None, None), (None, T0 + 100_000, T0 + 400_000)]:
        want = read(loop, indexed, *window)
        assert want == reference(indexed, *window), window
        got = read(loop, bare, *window)
        assert got == want, window
        assert [m[1] for m in got] == sorted(m[1] for m in got)
    assert len(read(loop, bare, *WINDOWS[0])) == 600


@pytest.mark.parametrize("keep", [0.2, 0.5, 0.9, 0.999])
def test_a_truncated_unindexed_recording_is_invalid_not_short(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, keep: float
) -> None:
    whole = write_recording(tmp_path / "whole.mcap", Spec(seconds=2, summary=False))
    data = whole.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InvalidRecording):
        read(loop, cut)
    # A recorder killed mid-file whose last bytes happen to be MCAP's magic: still refused.
    cut.write_bytes(data[: int(len(data) * keep)] + data[:8])
    with pytest.raises(InvalidRecording):
        read(loop, cut)


def test_a_large_unindexed_recording_is_read_in_bounded_memory(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    limit = 8 * MIB
    spec = Spec(
        seconds=12,
        joint_hz=50,
        event_hz=5,
        camera_hz=32,
        camera_bytes=64 * 1024,
        chunk_size=256 * 1024,
        compression=CompressionType.NONE,
        summary=False,
    )
    path = write_recording(tmp_path / "big.mcap", spec)
    assert path.stat().st_size > 3 * limit
    count = 0
    total = 0
    tracemalloc.start()
    try:
        with open_messages(loop, path) as messages:
            for message in messages:
                count += 1
                total += len(message.data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 12 * (50 + 5 + 32)
    assert total > 3 * limit
    assert peak < limit, f"peak {peak} bytes reading a {path.stat().st_size} byte recording"
