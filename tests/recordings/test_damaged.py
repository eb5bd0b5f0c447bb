"""Recordings damaged after they were written: window reads refuse them with InvalidRecording.

``add`` reads only the summary of a file that has one, so a recording whose
chunks are damaged is added; reading a window of it must then fail typed,
never with a decompressor's or decoder's own exception, and never return
messages that differ from what was recorded.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from mcap.stream_reader import StreamReader
from mcap.writer import CompressionType

import lake_sdk
from lake_core.errors import HashMismatch
from lake_core.models import DataLocation
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap import messages, recording_summary
from tests.recordings.conftest import Recordings, objects
from tools.lake_testing.recordings import SECOND, T0, Spec, write_recording


def _chunk_data_offset(data: bytes, path: Path) -> int:
    """Where the first chunk's (possibly compressed) records sit in ``data``."""
    with path.open("rb") as f:
        chunk = next(
            r for r in StreamReader(f, emit_chunks=True).records if type(r).__name__ == "Chunk"
        )
    return data.index(chunk.data)  # type: ignore[attr-defined]


def _flipped(path: Path, position: int, out: Path) -> Path:
    data = path.read_bytes()
    out.write_bytes(data[:position] + bytes([data[position] ^ 0x20]) + data[position + 1 :])
    return out


def _added(recordings: Recordings, client: lake_sdk.Client, path: Path) -> DataLocation:
    client.add_recording(recordings.table, path)
    found = client.query_table(
        f"SELECT recording FROM {recordings.table} WHERE name = '{path.name}'"
    )
    return lake_sdk.data_location(found, "recording", 0)


def test_a_chunk_that_does_not_decompress_is_invalid_recording(
    local_recordings: Recordings, tmp_path: Path
) -> None:
    good = write_recording(tmp_path / "good.mcap", Spec(compression=CompressionType.ZSTD))
    start = _chunk_data_offset(good.read_bytes(), good)
    bad = _flipped(good, start + 40, tmp_path / "zstd.mcap")
    with lake_sdk.Client(local_recordings.url) as client:
        location = _added(local_recordings, client, bad)  # its summary is intact
        with pytest.raises(InvalidRecording, match="ZstdError"):
            list(messages(client, location))


#: Chunks mcap reads by their index, or linearly (its fallback without chunk indexes).
#: (An unchunked file from mcap's Python writer has no CRC at all: nothing to check.)
UNCOMPRESSED = {
    "chunk-indexes": Spec(compression=CompressionType.NONE),
    "chunks-without-indexes": Spec(compression=CompressionType.NONE, indexes=False),
}


@pytest.mark.parametrize("layout", list(UNCOMPRESSED))
def test_a_changed_message_byte_fails_the_crc_instead_of_reading_as_data(
    local_recordings: Recordings, tmp_path: Path, layout: str
) -> None:
    good = write_recording(tmp_path / "good.mcap", UNCOMPRESSED[layout])
    # The first JSON event lies in the clear: 'kind' becomes 'Kind', still valid JSON.
    bad = _flipped(good, good.read_bytes().index(b'"kind"') + 1, tmp_path / f"{layout}.mcap")
    with lake_sdk.Client(local_recordings.url) as client:
        location = _added(local_recordings, client, bad)  # its summary is intact
        with pytest.raises(InvalidRecording, match=r"(?i)crc"):
            list(messages(client, location, topics="/events"))


def _first_chunk_index(data: bytes) -> int:
    """Where the summary's first ChunkIndex record starts (opcode 0x08)."""
    (position,) = struct.unpack_from("<Q", data, len(data) - 8 - 29 + 9)  # the footer's start
    while data[position] != 0x08:
        (length,) = struct.unpack_from("<Q", data, position + 1)
        position += 1 + 8 + length
    return position


def test_a_damaged_summary_is_refused_not_read_as_a_shorter_recording(
    local_recordings: Recordings, tmp_path: Path
) -> None:
    good = write_recording(tmp_path / "good.mcap", Spec())
    data = good.read_bytes()
    # The chunk index's message_start_time, top byte: the chunk seems to start far later.
    bad = _flipped(good, _first_chunk_index(data) + 9 + 7, tmp_path / "bad.mcap")
    window = {"start": T0, "end": T0 + SECOND}
    with lake_sdk.Client(local_recordings.url) as client:
        stored = objects(local_recordings.stage)
        with pytest.raises(InvalidRecording, match="summary is corrupt"):
            client.add_recording(local_recordings.table, bad)
        assert objects(local_recordings.stage) == stored
        location = _added(local_recordings, client, good)
        assert len(list(messages(client, location, **window))) == 55
        # The same damage to the stored object: a window read refuses it too.
        (object_path,) = [p for p in objects(local_recordings.stage) if p.read_bytes() == data]
        object_path.write_bytes(bad.read_bytes())
        with pytest.raises(InvalidRecording, match="summary is corrupt"):
            list(messages(client, location, **window))


def test_a_stored_object_that_fails_its_hash_is_a_storage_fault_not_a_bad_recording(
    local_recordings: Recordings, tmp_path: Path
) -> None:
    # No summary: recording_summary reads the whole object, so its SHA-256 is checked.
    good = write_recording(tmp_path / "good.mcap", Spec(chunked=False, summary=False))
    data = good.read_bytes()
    with lake_sdk.Client(local_recordings.url) as client:
        location = _added(local_recordings, client, good)
        (object_path,) = [p for p in objects(local_recordings.stage) if p.read_bytes() == data]
        # A byte MCAP itself does not check (an unchunked message has no CRC).
        object_path.write_bytes(
            _flipped(good, data.index(b'"kind"') + 1, tmp_path / "x").read_bytes()
        )
        with pytest.raises(HashMismatch):
            recording_summary(client, location)
