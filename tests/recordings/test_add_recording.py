"""Adding MCAP recordings: summary columns equal mcap's reader, bad files refused before upload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from mcap.reader import make_reader
from mcap.stream_reader import StreamReader

import lake_sdk
from lake_sdk.errors import InvalidArgument, InvalidRecording
from lake_sdk.recordings import MEDIA_TYPE
from lake_sdk.recordings_cli import recordings
from tests.recordings.conftest import Recordings, objects
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.recordings import Spec, write_recording

SPECS = {
    "chunked-summary": Spec(),
    "chunked-no-summary": Spec(summary=False),
    "unchunked-summary": Spec(chunked=False),
    "unchunked-no-summary": Spec(chunked=False, summary=False),
}


def expected(path: Path) -> dict[str, object]:
    """The row's figures as mcap's own stream reader counts them."""
    counts: dict[str, int] = {}
    times: list[int] = []
    topics: dict[int, tuple[str, int, str]] = {}
    schemas: dict[int, str] = {}
    with path.open("rb") as f:
        for record in StreamReader(f).records:
            kind = type(record).__name__
            if kind == "Schema":
                schemas[record.id] = record.name  # type: ignore[attr-defined]
            elif kind == "Channel":
                topics[record.id] = (record.topic, record.schema_id, record.message_encoding)  # type: ignore[attr-defined]
            elif kind == "Message":
                topic = topics[record.channel_id][0]  # type: ignore[attr-defined]
                counts[topic] = counts.get(topic, 0) + 1
                times.append(record.log_time)  # type: ignore[attr-defined]
    return {
        "message_count": len(times),
        "start": min(times),
        "end": max(times),
        "topics": sorted(
            (
                {
                    "topic": t,
                    "schema_name": schemas[s],
                    "message_encoding": e,
                    "message_count": counts.get(t, 0),
                }
                for t, s, e in topics.values()
            ),
            key=lambda r: str(r["topic"]),
        ),
    }


def _by_topic(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return sorted(rows, key=lambda r: str(r["topic"]))


@pytest.mark.parametrize("kind", list(SPECS))
def test_add_recording_row_equals_the_mcap_reader(
    local_recordings: Recordings, tmp_path: Path, kind: str
) -> None:
    path = write_recording(tmp_path / f"{kind}.mcap", SPECS[kind])
    want = expected(path)
    with lake_sdk.Client(local_recordings.url) as client:
        before = client.versions(local_recordings.table).num_rows
        added = client.add_recording(
            local_recordings.table, path, values={"robot_id": "r1", "site": "lab", "shift": 3}
        )
        assert added.summary.from_summary == ("no-summary" not in kind)
        table = client.query_table(
            "SELECT recording, name, start_time, end_time, duration_s, message_count, topics, "
            f"robot_id, site, shift FROM {local_recordings.table}"
        )
        assert client.versions(local_recordings.table).num_rows == before + 1
        row = table.to_pylist()[0]
        assert row["message_count"] == want["message_count"]
        assert table.column("start_time").cast("int64")[0].as_py() == want["start"]
        assert table.column("end_time").cast("int64")[0].as_py() == want["end"]
        assert row["duration_s"] == pytest.approx((want["end"] - want["start"]) / 1e9)  # type: ignore[operator]
        assert _by_topic(row["topics"]) == _by_topic(want["topics"])  # type: ignore[arg-type]
        assert (row["name"], row["robot_id"], row["site"], row["shift"]) == (
            path.name,
            "r1",
            "lab",
            3,
        )
        location = lake_sdk.data_location(table, "recording", 0)
        assert location.media_type == MEDIA_TYPE
        with client.open(location) as reader:
            assert reader.read() == path.read_bytes()


@pytest.mark.asyncio
async def test_async_client_adds_a_recording(local_recordings: Recordings, tmp_path: Path) -> None:
    path = write_recording(tmp_path / "a.mcap", Spec(seconds=1))
    async with lake_sdk.AsyncClient(local_recordings.url) as client:
        added = await client.add_recording(str(local_recordings.table), path)
        table = await client.query_table(
            f"SELECT message_count, robot_id FROM {local_recordings.table}"
        )
    assert table.to_pylist() == [{"message_count": added.summary.message_count, "robot_id": None}]


def _damaged(tmp_path: Path) -> dict[str, Path]:
    good = write_recording(tmp_path / "good.mcap", Spec()).read_bytes()
    unsummarized = write_recording(tmp_path / "plain.mcap", Spec(summary=False)).read_bytes()
    files = {
        "not-mcap": b"\x00\x00\x00\x18ftypmp42" + bytes(4000),
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "truncated-no-summary": unsummarized[:-20],
        # A flipped byte inside the compressed chunk of a file the reader must scan.
        "corrupt-chunk": unsummarized[:200]
        + bytes([unsummarized[200] ^ 0xFF])
        + unsummarized[201:],
    }
    out = {}
    for name, data in files.items():
        out[name] = tmp_path / f"{name}.mcap"
        out[name].write_bytes(data)
    return out


def test_bad_files_are_refused_before_upload(local_recordings: Recordings, tmp_path: Path) -> None:
    damaged = _damaged(tmp_path)
    with lake_sdk.Client(local_recordings.url) as client:
        before = client.versions(local_recordings.table).num_rows
        stored = objects(local_recordings.stage)
        for name, path in damaged.items():
            with pytest.raises(InvalidRecording):
                client.add_recording(local_recordings.table, path)
            assert objects(local_recordings.stage) == stored, name
        assert client.versions(local_recordings.table).num_rows == before
        assert (
            client.query_table(f"SELECT count(*) AS n FROM {local_recordings.table}")["n"][
                0
            ].as_py()
            == 0
        )


def test_a_flipped_byte_in_a_scanned_chunk_fails_its_crc(tmp_path: Path) -> None:
    from lake_sdk.recordings import read_summary

    data = write_recording(tmp_path / "p.mcap", Spec(summary=False)).read_bytes()
    with (tmp_path / "p.mcap").open("rb") as f:
        chunk = next(
            r for r in StreamReader(f, emit_chunks=True).records if type(r).__name__ == "Chunk"
        )
    # The chunk's compressed records start after its fixed fields; flip one byte there.
    position = data.index(chunk.data) + len(chunk.data) // 2  # type: ignore[attr-defined]
    bad = tmp_path / "bad.mcap"
    bad.write_bytes(data[:position] + bytes([data[position] ^ 0x55]) + data[position + 1 :])
    with pytest.raises(InvalidRecording):
        read_summary(bad)


def test_bad_values_and_tables_are_refused_before_upload(
    local_recordings: Recordings, tmp_path: Path
) -> None:
    path = write_recording(tmp_path / "a.mcap", Spec(seconds=1))
    stored = objects(local_recordings.stage)
    with lake_sdk.Client(local_recordings.url) as client:
        with pytest.raises(InvalidArgument, match="shift"):
            client.add_recording(local_recordings.table, path, values={"shift": "morning"})
        with pytest.raises(InvalidArgument, match="set by add_recording"):
            client.add_recording(local_recordings.table, path, values={"message_count": 1})
        with pytest.raises(lake_sdk.TableNotFound):
            client.add_recording("robots.nope", path)
    assert objects(local_recordings.stage) == stored


def test_cli_creates_the_table_and_adds_with_set_and_json(
    shared_lake: LakeCluster, tmp_path: Path
) -> None:
    runner = CliRunner()
    created = runner.invoke(
        recordings,
        [
            "create-table",
            "fleet.bags",
            "--column",
            "robot_id:utf8",
            "--column",
            "battery:float64",
            "--meta-addr",
            shared_lake.meta.addr,
            "--output",
            "json",
        ],
        catch_exceptions=False,
    )
    assert created.exit_code == 0, created.output
    columns = json.loads(created.output)["columns"]
    assert "recording: file" in columns
    assert "battery: double" in columns
    first = write_recording(tmp_path / "one.mcap", Spec(seconds=1))
    second = write_recording(tmp_path / "two.mcap", Spec(seconds=2, summary=False))
    result = runner.invoke(
        recordings,
        [
            "add",
            "fleet.bags",
            str(first),
            str(second),
            "--set",
            "robot_id=r7",
            "--set",
            "battery=0.75",
            "--addr",
            shared_lake.query.url,
            "--output",
            "json",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    added = json.loads(result.output)
    assert [a["name"] for a in added] == ["one.mcap", "two.mcap"]
    assert added[1]["version"] == added[0]["version"] + 1
    with lake_sdk.Client(shared_lake.query.url) as client:
        rows = client.query_table(
            "SELECT name, robot_id, battery, message_count FROM fleet.bags ORDER BY name"
        ).to_pylist()
    assert rows == [
        {"name": "one.mcap", "robot_id": "r7", "battery": 0.75, "message_count": 55},
        {"name": "two.mcap", "robot_id": "r7", "battery": 0.75, "message_count": 110},
    ]
    with first.open("rb") as f:
        stats = make_reader(f).get_summary().statistics  # type: ignore[union-attr]
    assert stats is not None
    assert stats.message_count == 55


def test_importing_lake_sdk_needs_no_mcap_and_the_call_names_the_extra(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write_recording(tmp_path / "a.mcap", Spec(seconds=1))
    code = f"""
import sys
class Block:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in ("mcap", "mcap_ros2"):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block)
import lake_sdk, lake_sdk.mcap, lake_sdk.recordings
from lake_sdk.errors import MissingExtra
try:
    lake_sdk.recordings.read_summary({str(path)!r})
except MissingExtra as exc:
    print("MISSING", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "MISSING" in out.stdout
    # Lake is on no index: the hint names the extra's own libraries and the checkout path.
    assert "'mcap<2,>=1.6'" in out.stdout
    assert "'mcap-ros2-support<1,>=0.6'" in out.stdout
    assert "(the lake-sdk[mcap] extra; or pip install './packages/lake-sdk[mcap]'" in out.stdout


@pytest.mark.s3
def test_s3_stage(s3_recordings: Recordings, tmp_path: Path) -> None:
    path = write_recording(tmp_path / "a.mcap", Spec(seconds=2, summary=False))
    with lake_sdk.Client(s3_recordings.url) as client:
        added = client.add_recording(s3_recordings.table, path, values={"site": "s3"})
        table = client.query_table(
            f"SELECT recording, message_count, site FROM {s3_recordings.table}"
        )
        assert table["message_count"][0].as_py() == added.summary.message_count == 110
        location = lake_sdk.data_location(table, "recording", 0)
        assert location.uri.startswith("s3://")
        with client.open(location) as reader:
            assert reader.read() == path.read_bytes()


def test_log_times_past_2262_are_an_invalid_recording_before_upload(
    local_recordings: Recordings, tmp_path: Path
) -> None:
    from mcap.writer import Writer

    path = tmp_path / "far.mcap"
    with path.open("wb") as out:
        writer = Writer(out)
        writer.start()
        channel = writer.register_channel("/far", "json", 0)
        for t in (2**63 - 1, 2**63, 2**64 - 1):  # MCAP's log times are uint64
            writer.add_message(channel, log_time=t, data=b"{}", publish_time=t)
        writer.finish()
    stored = objects(local_recordings.stage)
    with lake_sdk.Client(local_recordings.url) as client:
        with pytest.raises(InvalidRecording, match="2262"):
            client.add_recording(local_recordings.table, path)
        assert client.versions(local_recordings.table).num_rows == 1  # the creation only
    assert objects(local_recordings.stage) == stored
