"""lake recordings extract: a topic as typed rows, equal to the decoded messages, idempotent."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from mcap.reader import make_reader
from mcap.writer import Writer
from mcap_ros2.decoder import DecoderFactory

import lake_sdk
from lake_sdk.errors import InvalidRecording, NotFound
from lake_sdk.mcap import extract_topic
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
