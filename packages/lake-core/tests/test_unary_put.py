"""The framing of Metasrv's unary append (``lake_core.flight.unary_put``)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from lake_core.errors import InvalidFlightData
from lake_core.flight import unary_put
from lake_core.flight.encoding import FlightDataDecoder, encode_stream
from lake_core.proto import flight_pb2 as pb


def _messages(rows: int) -> list[bytes]:
    schema = pa.schema([("id", pa.int64()), ("name", pa.utf8())])
    batches = [
        pa.record_batch([pa.array(range(n)), pa.array([f"r{i}" for i in range(n)])], schema)
        for n in (rows, 1, rows // 2)
    ]
    return list(encode_stream(schema, batches, descriptor=b"\x08\x02\x12\x03abc"))


@pytest.mark.parametrize("rows", [0, 1, 1000])
def test_unpack_gives_back_the_messages_and_their_batches(rows: int) -> None:
    raws = _messages(rows)
    body = unary_put.pack(raws)
    assert len(body) == unary_put.framed_size(raws)
    messages = unary_put.unpack(body)
    assert [m.SerializeToString() for m in messages] == raws
    decoder = FlightDataDecoder()
    batches = [b for m in messages for b in decoder.feed(m)]
    assert [b.num_rows for b in batches] == [rows, 1, rows // 2]
    assert decoder.descriptor is not None
    assert decoder.descriptor.cmd == b"abc"


def test_empty_messages_frame_too() -> None:
    assert unary_put.unpack(unary_put.pack([b"", b""])) == [pb.FlightData(), pb.FlightData()]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "no message"),
        (b"\x01\x00", "inside a message's length"),
        (b"\x05\x00\x00\x00ab", "says 5 bytes, 2 are left"),
        (b"\x02\x00\x00\x00\xff\xff", "is not FlightData"),
    ],
)
def test_malformed_bodies_are_invalid_flight_data(body: bytes, says: str) -> None:
    with pytest.raises(InvalidFlightData, match=says):
        unary_put.unpack(body)


def test_too_many_messages_are_refused() -> None:
    with pytest.raises(InvalidFlightData, match="more than"):
        unary_put.unpack(unary_put.pack([b""] * (unary_put.MAX_MESSAGES + 1)))
    assert len(unary_put.unpack(unary_put.pack([b""] * unary_put.MAX_MESSAGES))) == (
        unary_put.MAX_MESSAGES
    )


def test_cut_or_flipped_bodies_unpack_or_raise_invalid_flight_data() -> None:
    """Whatever a body holds, unpack returns messages or raises the typed error."""
    body = unary_put.pack(_messages(50))
    rng = random.Random(7)
    outcomes = {"ok": 0, "refused": 0}
    for cut in range(0, len(body), 7):
        try:
            unary_put.unpack(body[:cut])
            outcomes["ok"] += 1
        except InvalidFlightData:
            outcomes["refused"] += 1
    for _ in range(2000):
        flipped = bytearray(body)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        try:
            unary_put.unpack(bytes(flipped))
            outcomes["ok"] += 1
        except InvalidFlightData:
            outcomes["refused"] += 1
    assert outcomes["ok"]
    assert outcomes["refused"]
