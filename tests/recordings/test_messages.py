"""Time-range reads through open_file equal mcap's reader on the local file, and fetch little."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from mcap.reader import make_reader
from mcap.writer import CompressionType
from mcap_ros2.decoder import DecoderFactory

import lake_sdk
from lake_core.models import DataLocation
from lake_sdk.mcap import messages, messages_async, recording_summary
from lake_sdk.mcap.read import plain
from lake_sdk.recordings import read_summary
from tests.recordings.conftest import Recordings
from tools.lake_testing.recordings import SECOND, T0, Spec, write_recording

SPECS = {
    "chunked-summary": Spec(seconds=4, chunk_size=8 * 1024),
    "chunked-no-summary": Spec(seconds=3, summary=False, chunk_size=8 * 1024),
    "unchunked-summary": Spec(seconds=3, chunked=False),
    "unchunked-no-summary": Spec(seconds=2, chunked=False, summary=False),
}
#: A minute of data, most of it a raw camera topic: the byte-bound recording.
MINUTE = Spec(
    seconds=60,
    joint_hz=50,
    event_hz=5,
    camera_hz=20,
    camera_bytes=20 * 1024,
    chunk_size=256 * 1024,
    compression=CompressionType.NONE,
)
TOPIC_SETS = [None, ["/joint_states"], ["/events"], ["/joint_states", "/events"], ["/nope"]]


def reference(
    path: Path, topics: list[str] | None, start: int | None, end: int | None
) -> list[tuple[str, int, bytes, object]]:
    """What mcap's reader gives on the local file (decoded to plain values)."""
    import json

    ros2 = DecoderFactory()
    with path.open("rb") as f:
        out = []
        for schema, channel, message in make_reader(f).iter_messages(
            topics=topics, starting_at=start, ending_before=end, log_time_order=True
        ):
            if channel.message_encoding == "json":
                decoded = json.loads(message.data)
            else:
                decode = ros2.decoder_for(channel.message_encoding, schema)
                assert decode is not None
                decoded = plain(decode(message.data))
            out.append((channel.topic, message.log_time, message.data, decoded))
    return out


def windows(seed: int, seconds: float) -> Iterator[tuple[list[str] | None, int | None, int | None]]:
    rng = random.Random(seed)
    yield None, None, None
    yield ["/joint_states"], T0, T0 + SECOND
    yield ["/events"], None, T0 + SECOND // 2
    for _ in range(6):
        start = T0 + rng.randrange(-SECOND, int(seconds * SECOND))
        yield rng.choice(TOPIC_SETS), start, start + rng.randrange(1, 2 * SECOND)


@pytest.fixture(scope="module")
def added(
    shared_lake, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, DataLocation]]:  # type: ignore[no-untyped-def]
    """Every spec's recording added to one recordings table: its local path and location."""
    from lake_core.names import TableRef
    from tests.recordings.conftest import RECORDINGS_SCHEMA
    from tools.lake_testing.data import create_table

    root = tmp_path_factory.mktemp("mcap")
    table = TableRef("robots", "windows")
    create_table(shared_lake.meta.addr, table, RECORDINGS_SCHEMA)
    out = {}
    with lake_sdk.Client(shared_lake.query.url) as client:
        for name, spec in {**SPECS, "minute": MINUTE}.items():
            path = write_recording(root / f"{name}.mcap", spec)
            client.add_recording(table, path, values={"site": name})
        rows = client.query_table(f"SELECT site, recording FROM {table}")
        for row in range(rows.num_rows):
            site = rows["site"][row].as_py()
            out[site] = (root / f"{site}.mcap", lake_sdk.data_location(rows, "recording", row))
    return out


def _got(window: lake_sdk.mcap.Messages) -> list[tuple[str, int, bytes, object]]:
    return [(m.topic, m.log_time_ns, m.data, m.decoded) for m in window]


@pytest.mark.parametrize("kind", list(SPECS))
def test_windows_equal_the_mcap_reader(shared_lake, added, kind: str) -> None:  # type: ignore[no-untyped-def]
    path, location = added[kind]
    with lake_sdk.Client(shared_lake.query.url) as client:
        for seed, (topics, start, end) in enumerate(
            windows(hash(kind) % 1000, SPECS[kind].seconds)
        ):
            with messages(client, location, topics=topics, start=start, end=end) as window:
                got = _got(window)
            assert got == reference(path, topics, start, end), (seed, topics, start, end)
        assert any(_got(messages(client, location, topics="/events")))


def test_datetimes_bound_like_nanoseconds(shared_lake, added) -> None:  # type: ignore[no-untyped-def]
    path, location = added["chunked-summary"]
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=(T0 + SECOND) // 1000)
    with lake_sdk.Client(shared_lake.query.url) as client:
        got = _got(messages(client, location, start=start, end=start + timedelta(seconds=1)))
    assert got == reference(path, None, T0 + SECOND, T0 + 2 * SECOND)
    assert got
    with pytest.raises(lake_sdk.InvalidArgument):
        messages(client, location, start=datetime(2026, 1, 1))  # naive


@pytest.mark.asyncio
async def test_async_messages(shared_lake, added) -> None:  # type: ignore[no-untyped-def]
    path, location = added["chunked-no-summary"]
    async with lake_sdk.AsyncClient(shared_lake.query.url) as client:
        window = await messages_async(
            client, location, topics=["/joint_states"], start=T0, end=T0 + SECOND
        )
        got = [(m.topic, m.log_time_ns, m.data, m.decoded) async for m in window]
    assert got == reference(path, ["/joint_states"], T0, T0 + SECOND)
    assert len(got) == 50


def test_one_second_of_one_topic_fetches_under_5_percent(shared_lake, added) -> None:  # type: ignore[no-untyped-def]
    path, location = added["minute"]
    assert location.size_bytes > 20 * 1024 * 1024
    with lake_sdk.Client(shared_lake.query.url) as client:
        for second in (0, 17, 59):
            start = T0 + second * SECOND
            with messages(
                client, location, topics=["/joint_states"], start=start, end=start + SECOND
            ) as window:
                got = _got(window)
            assert got == reference(path, ["/joint_states"], start, start + SECOND)
            assert len(got) == 50
            assert window.bytes_fetched <= 0.05 * location.size_bytes, window.bytes_fetched
        summary, fetched = recording_summary(client, location)
    assert fetched <= 64 * 1024
    assert summary == read_summary(path)


def test_summary_of_each_kind_equals_the_local_one(shared_lake, added) -> None:  # type: ignore[no-untyped-def]
    with lake_sdk.Client(shared_lake.query.url) as client:
        for kind in SPECS:
            path, location = added[kind]
            summary, _ = recording_summary(client, location)
            local = read_summary(path)
            assert (summary.start_ns, summary.end_ns, summary.message_count, summary.topics) == (
                local.start_ns,
                local.end_ns,
                local.message_count,
                local.topics,
            )


@pytest.mark.s3
def test_windows_from_the_s3_stage(s3_recordings: Recordings, tmp_path: Path) -> None:
    spec = Spec(
        seconds=60,
        camera_hz=20,
        camera_bytes=16 * 1024,
        chunk_size=128 * 1024,
        compression=CompressionType.NONE,
    )
    path = write_recording(tmp_path / "s3.mcap", spec)
    with lake_sdk.Client(s3_recordings.url) as client:
        client.add_recording(s3_recordings.table, path)
        table = client.query_table(f"SELECT recording FROM {s3_recordings.table}")
        location = lake_sdk.data_location(table, "recording", 0)
        start = T0 + 7 * SECOND
        with messages(
            client, location, topics="/joint_states", start=start, end=start + SECOND
        ) as w:
            got = _got(w)
        assert got == reference(path, ["/joint_states"], start, start + SECOND)
        assert w.bytes_fetched <= 0.05 * location.size_bytes
