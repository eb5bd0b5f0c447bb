"""lake recordings extract: a topic as typed rows, equal to the decoded messages, idempotent."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from mcap.reader import make_reader
from mcap.stream_reader import StreamReader
from mcap.writer import CompressionType, Writer
from mcap_ros2.decoder import DecoderFactory

import lake_sdk
from lake_sdk import AsyncClient
from lake_sdk.errors import InvalidRecording, NotFound
from lake_sdk.mcap import Extracted, extract_topic
from lake_sdk.mcap import extract as extract_module
from lake_sdk.mcap.read import plain
from lake_sdk.recordings_cli import recordings
from tests.recordings.conftest import Recordings
from tools.lake_testing.recordings import Spec, write_recording

TIME = pa.timestamp("ns", tz="UTC")


def decoded(path: Path, topic: str) -> list[tuple[int, object]]:
    ros2 = DecoderFactory()
    out = []
    with path.open("rb") as f:
        for schema, channel, message in make_reader(f).iter_messages(topics=[topic]):
            if channel.message_encoding == "json":
                out.append((message.log_time, json.loads(message.data)))
            else:
                decode = ros2.decoder_for(channel.message_encoding, schema)
                assert decode is not None
                out.append((message.log_time, plain(decode(message.data))))
    return out


@pytest.fixture
def two(local_recordings: Recordings, tmp_path: Path) -> dict[str, Path]:
    paths = {
        "a": write_recording(tmp_path / "a.mcap", Spec(seconds=1)),
        "b": write_recording(tmp_path / "b.mcap", Spec(seconds=2, summary=False, joint_hz=20)),
    }
    with lake_sdk.Client(local_recordings.url) as client:
        for site, path in paths.items():
            client.add_recording(local_recordings.table, path, values={"site": site})
    return paths


def _rows(client: lake_sdk.Client, table: str, sha: str) -> list[tuple[int, object]]:
    got = client.query_table(
        f"SELECT * FROM {table} WHERE recording_sha256 = '{sha}' ORDER BY log_time"
    )
    times = got.column("log_time").cast(pa.int64()).to_pylist()
    fields = [n for n in got.column_names if n not in ("recording_sha256", "log_time")]
    return list(zip(times, got.select(fields).to_pylist(), strict=True))


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_ros2_topic_typed_and_equal_to_decoded_and_idempotent(
    local_recordings: Recordings, two: dict[str, Path]
) -> None:
    into = f"robots.joints_{local_recordings.table.name}"
    with lake_sdk.Client(local_recordings.url) as client:
        first = extract_topic(
            client,
            str(local_recordings.table),
            "/joint_states",
            into,
            meta_addr=local_recordings.cluster.meta.addr,
        )
        assert (first.recordings, first.skipped, first.rows) == (2, 0, 50 + 40)
        assert len(first.versions) == 2  # one version per recording
        schema = client.table_schema(into)
        assert schema.field("log_time").type == TIME
        assert schema.field("header").type == pa.struct(
            [
                ("stamp", pa.struct([("sec", pa.int32()), ("nanosec", pa.uint32())])),
                ("frame_id", pa.utf8()),
            ]
        )
        assert schema.field("name").type == pa.list_(pa.utf8())
        assert schema.field("position").type == pa.list_(pa.float64())
        for path in two.values():
            assert _rows(client, into, _sha(path)) == decoded(path, "/joint_states")
        again = extract_topic(
            client,
            str(local_recordings.table),
            "/joint_states",
            into,
            meta_addr=local_recordings.cluster.meta.addr,
        )
        assert (again.skipped, again.rows, again.versions) == (2, 0, ())
        count = client.query_table(f"SELECT count(*) AS n FROM {into}")["n"][0].as_py()
        assert count == 90


def test_json_topic_through_the_cli_with_where(
    local_recordings: Recordings, two: dict[str, Path]
) -> None:
    into = f"robots.events_{local_recordings.table.name}"
    args = ["extract", str(local_recordings.table), "--topic", "/events", "--into", into]
    args += ["--where", "site = 'b'", "--addr", local_recordings.url]
    args += ["--meta-addr", local_recordings.cluster.meta.addr, "--output", "json"]
    result = CliRunner().invoke(recordings, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    done = json.loads(result.output)
    assert (done["recordings"], done["rows"]) == (1, 10)
    with lake_sdk.Client(local_recordings.url) as client:
        schema = client.table_schema(into)
        assert schema.field("pose").type == pa.struct([("x", pa.float64()), ("y", pa.float64())])
        assert schema.field("step").type == pa.int64()
        assert schema.field("ok").type == pa.bool_()
        assert schema.field("tags").type == pa.list_(pa.utf8())
        assert _rows(client, into, _sha(two["b"])) == decoded(two["b"], "/events")
        assert _rows(client, into, _sha(two["a"])) == []


def _misfits(path: Path) -> Path:
    """JSON topics whose messages do not fit their schema (an object with an integer ``i``)."""
    schema = json.dumps({"type": "object", "properties": {"i": {"type": "integer"}}}).encode()
    bodies = {"/list": b"[1, 2]", "/text": b'{"i": "x"}', "/huge": b'{"i": 99999999999999999999}'}
    with path.open("wb") as out:
        writer = Writer(out)
        writer.start()
        schema_id = writer.register_schema("Misfit", "jsonschema", schema)
        for n, (topic, body) in enumerate(bodies.items()):
            channel = writer.register_channel(topic, "json", schema_id)
            writer.add_message(channel, log_time=n, data=b'{"i": 1}', publish_time=n)
            writer.add_message(channel, log_time=n + 10, data=body, publish_time=n + 10)
        writer.finish()
    return path


@pytest.mark.parametrize("topic", ["/list", "/text", "/huge"])
def test_messages_that_do_not_fit_their_schema_are_invalid_recording(
    local_recordings: Recordings, tmp_path: Path, topic: str
) -> None:
    into = f"robots.misfit_{local_recordings.table.name}"
    _refused(local_recordings, _misfits(tmp_path / "misfits.mcap"), topic, into, match=topic)
    # Nothing of the failed extraction is left: not even an empty table.
    with lake_sdk.Client(local_recordings.url) as client, pytest.raises(NotFound):
        client.table_schema(into)


def _refused(
    recordings: Recordings, path: Path, topic: str, into: str, match: str | None = None
) -> None:
    """Add the recording at ``path``; extracting ``topic`` from it is InvalidRecording."""
    with lake_sdk.Client(recordings.url) as client:
        client.add_recording(recordings.table, path)
        with pytest.raises(InvalidRecording, match=match):
            extract_topic(
                client, str(recordings.table), topic, into, meta_addr=recordings.cluster.meta.addr
            )


def _bad_schemas(path: Path) -> Path:
    """Topics whose schema in the file cannot be read: not JSON, not UTF-8, a bad msg name."""
    with path.open("wb") as out:
        writer = Writer(out)
        writer.start()
        for n, (topic, name, encoding, data) in enumerate(
            [
                ("/not-json", "Bad", "jsonschema", b"{not json"),
                ("/not-utf8", "pkg/Bad", "ros2msg", b"\xff\xfe"),
                ("/bad-msg", "pkg/Bad", "ros2msg", b"garbage here"),
            ]
        ):
            schema_id = writer.register_schema(name, encoding, data)
            encoding_of_messages = "json" if encoding == "jsonschema" else "cdr"
            channel = writer.register_channel(topic, encoding_of_messages, schema_id)
            writer.add_message(channel, log_time=n, data=b"{}", publish_time=n)
        writer.finish()
    return path


@pytest.mark.parametrize("topic", ["/not-json", "/not-utf8", "/bad-msg"])
def test_an_unreadable_schema_is_invalid_recording(
    local_recordings: Recordings, tmp_path: Path, topic: str
) -> None:
    into = f"robots.badschema_{local_recordings.table.name}"
    _refused(local_recordings, _bad_schemas(tmp_path / "schemas.mcap"), topic, into)


def _versions(client: lake_sdk.Client, table: str) -> list[int]:
    namespace, name = table.split(".")
    got = client.query_table(f'SELECT version FROM {namespace}."{name}$versions" ORDER BY version')
    return [int(v) for v in got.column("version").to_pylist()]


def _extract(
    recordings: Recordings, client: lake_sdk.Client, topic: str, into: str, **kw: str
) -> Extracted:
    return extract_topic(
        client, str(recordings.table), topic, into, meta_addr=recordings.cluster.meta.addr, **kw
    )


def test_more_rows_than_an_append_and_a_batch_are_one_version_each_row_once(
    local_recordings: Recordings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10,200 rows: past an append's 10,000 (the old path refused them), in 11 batches."""
    monkeypatch.setattr(extract_module, "BATCH_ROWS", 1000, raising=False)
    path = write_recording(tmp_path / "long.mcap", Spec(seconds=600, joint_hz=0, event_hz=17))
    into = f"robots.long_{local_recordings.table.name}"
    with lake_sdk.Client(local_recordings.url) as client:
        client.add_recording(local_recordings.table, path)
        first = _extract(local_recordings, client, "/events", into)
        assert (first.recordings, first.skipped, first.rows) == (1, 0, 10_200)
        assert len(first.versions) == 1
        assert _versions(client, into) == [0, *first.versions]  # created, then ONE append
        assert _rows(client, into, _sha(path)) == decoded(path, "/events")  # each row once
        again = _extract(local_recordings, client, "/events", into)
        assert (again.skipped, again.rows, again.versions) == (1, 0, ())
        assert _versions(client, into) == [0, *first.versions]


def _camera(path: Path, seconds: int) -> Path:
    """A /camera topic of 64 KiB images at 20 Hz: 1.25 MiB of messages per second."""
    spec = Spec(seconds=seconds, joint_hz=0, event_hz=0, camera_hz=20, camera_bytes=64 * 1024)
    return write_recording(path, spec)


def test_memory_is_bounded_by_a_batch_not_by_the_recording(
    local_recordings: Recordings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python memory extract holds at its peak is the same for 2.5 and 10 MiB of images.

    The old path held every decoded row of a recording (about twice its
    messages' bytes); batches of 256 KiB of messages (and 1 MiB chunks) keep it under 4 MiB.
    """
    monkeypatch.setattr(extract_module, "BATCH_BYTES", 256 * 1024, raising=False)
    peaks = {}
    with lake_sdk.Client(local_recordings.url) as client:
        for seconds in (2, 8):
            path = _camera(tmp_path / f"camera-{seconds}.mcap", seconds)
            client.add_recording(local_recordings.table, path, values={"site": f"s{seconds}"})
            into = f"robots.camera{seconds}_{local_recordings.table.name}"
            tracemalloc.start()
            try:
                done = _extract(
                    local_recordings, client, "/camera", into, where=f"site = 's{seconds}'"
                )
                peaks[seconds] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert (done.rows, len(done.versions)) == (seconds * 20, 1)
    assert peaks[8] < 4 * 2**20, peaks  # 10 MiB of images went through
    assert peaks[8] < 1.5 * peaks[2], peaks  # not growing with the recording


def _corrupt_middle_chunk(good: Path, out: Path) -> Path:
    """``good`` with one byte of its middle chunk's compressed records flipped."""
    data = good.read_bytes()
    with good.open("rb") as f:
        chunks = [
            r for r in StreamReader(f, emit_chunks=True).records if type(r).__name__ == "Chunk"
        ]
    assert len(chunks) >= 4
    position = data.index(chunks[len(chunks) // 2].data) + 40  # type: ignore[attr-defined]
    out.write_bytes(data[:position] + bytes([data[position] ^ 0x20]) + data[position + 1 :])
    return out


@pytest.mark.parametrize("table", ["exists", "missing"])
def test_a_recording_corrupt_in_its_middle_leaves_no_rows(
    local_recordings: Recordings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    """Rows decoded before the damaged chunk were streamed; the ingest aborts, none commit."""
    monkeypatch.setattr(extract_module, "BATCH_ROWS", 20, raising=False)
    sent: list[int] = []
    ingest = AsyncClient.ingest

    async def counted(self: AsyncClient, target: str, data: pa.RecordBatchReader) -> int:
        def batches() -> Iterator[pa.RecordBatch]:
            for batch in data:
                sent.append(batch.num_rows)
                yield batch

        return await ingest(self, target, pa.RecordBatchReader.from_batches(data.schema, batches()))

    monkeypatch.setattr(AsyncClient, "ingest", counted)
    spec = Spec(
        seconds=60, joint_hz=0, event_hz=5, chunk_size=2048, compression=CompressionType.ZSTD
    )
    good = write_recording(tmp_path / "good.mcap", spec)
    bad = _corrupt_middle_chunk(good, tmp_path / "bad.mcap")
    into = f"robots.corrupt_{local_recordings.table.name}"
    with lake_sdk.Client(local_recordings.url) as client:
        before: list[int] = []
        if table == "exists":
            client.add_recording(local_recordings.table, good, values={"site": "good"})
            assert _extract(local_recordings, client, "/events", into).rows == 300
            before = _versions(client, into)
            sent.clear()
        client.add_recording(local_recordings.table, bad, values={"site": "bad"})
        with pytest.raises(InvalidRecording):
            _extract(local_recordings, client, "/events", into, where="site = 'bad'")
        if table == "missing":  # checked whole before the table is created: none is
            with pytest.raises(NotFound):
                client.table_schema(into)
            return
        assert sum(sent) >= 100  # rows of the chunks before the damage were streamed
        assert _rows(client, into, _sha(bad)) == []
        assert _versions(client, into) == before
        assert client.query_table(f"SELECT count(*) AS n FROM {into}")["n"][0].as_py() == 300
