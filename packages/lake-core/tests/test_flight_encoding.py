"""FlightData wire encoding/decoding and proto compatibility with pyarrow."""

from __future__ import annotations

import datetime as dt
import random
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from lake_core.flight import encoding
from lake_core.flight.encoding import (
    FlightDataDecoder,
    InvalidFlightData,
    PayloadTooLarge,
    decode_flight_data_stream,
    encode_batch,
    encode_schema,
    encode_stream,
    has_dictionary,
    varint,
)
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb


def _parse(messages: list[bytes]) -> list[pb.FlightData]:
    return [pb.FlightData.FromString(m) for m in messages]


def _dict_batch(i: int) -> pa.RecordBatch:
    # A different dictionary per batch exercises dictionary replacement.
    return pa.record_batch(
        {
            "n": pa.array([i, i + 1, None], pa.int64()),
            "d": pa.array([f"a{i}", "b", None]).dictionary_encode(),
            "ld": pa.array([[f"x{i}"], None, []], pa.list_(pa.dictionary(pa.int16(), pa.string()))),
        }
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (1000 << 3 | 2, b"\xc2\x3e"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint(value: int, expected: bytes) -> None:
    assert varint(value) == expected


def test_varint_rejects_negative() -> None:
    with pytest.raises(ValueError):
        varint(-1)


def test_encode_batch_matches_ipc_message() -> None:
    batch = pa.record_batch({"x": [1, 2, 3], "s": ["a", None, "c"]})
    data = pb.FlightData.FromString(encode_batch(batch, app_metadata=b"meta"))
    ipc = pa.ipc.read_message(batch.serialize())
    assert data.data_header == ipc.metadata.to_pybytes()
    assert data.data_body == ipc.body.to_pybytes()
    assert data.app_metadata == b"meta"
    assert not data.HasField("flight_descriptor")
    # The hand-built bytes are exactly what protobuf itself would produce.
    assert data.SerializeToString() == encode_batch(batch, app_metadata=b"meta")


def test_encode_schema_with_descriptor() -> None:
    schema = pa.schema([("x", pa.int32())], metadata={"k": "v"})
    desc = pb.FlightDescriptor(type=pb.FlightDescriptor.PATH, path=["ns", "t"])
    data = pb.FlightData.FromString(encode_schema(schema, desc.SerializeToString()))
    assert data.flight_descriptor == desc
    assert data.data_body == b""
    assert pa.ipc.read_schema(pa.ipc.read_message(pa.py_buffer(_framed(data)))) == schema


def _framed(data: pb.FlightData) -> bytes:
    pad = -len(data.data_header) % 8
    size = (len(data.data_header) + pad).to_bytes(4, "little")
    return b"\xff\xff\xff\xff" + size + data.data_header + bytes(pad) + data.data_body


def test_encode_batch_refuses_dictionaries() -> None:
    with pytest.raises(ValueError, match="encode_stream"):
        encode_batch(_dict_batch(0))


def test_has_dictionary_nested() -> None:
    assert not has_dictionary(pa.schema([("a", pa.list_(pa.int8()))]))
    nested = pa.struct([("m", pa.map_(pa.string(), pa.dictionary(pa.int8(), pa.string())))])
    assert has_dictionary(pa.schema([("a", nested)]))


def test_stream_roundtrip_plain() -> None:
    batches = [pa.record_batch({"x": pa.array(range(i, i + 5), pa.int64())}) for i in range(3)]
    desc = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=b"put")
    encoded = encode_stream(batches[0].schema, batches, descriptor=desc.SerializeToString())
    msgs = _parse(list(encoded))
    descriptor, schema, out, app = decode_flight_data_stream(msgs)
    assert descriptor == desc
    assert schema == batches[0].schema
    assert out == batches
    assert app == []


def test_stream_roundtrip_dictionary_replacement() -> None:
    batches = [_dict_batch(i) for i in range(3)]
    msgs = _parse(list(encode_stream(batches[0].schema, batches)))
    kinds = [pa.ipc.read_message(pa.py_buffer(_framed(m))).type for m in msgs]
    assert kinds[0] == "schema"
    assert kinds.count("dictionary") == 6
    assert kinds.count("record batch") == 3
    descriptor, schema, out, _ = decode_flight_data_stream(msgs)
    assert descriptor is None
    assert schema == batches[0].schema
    assert len(out) == 3
    for got, want in zip(out, batches, strict=True):
        assert got.equals(want)


def test_decoder_incremental_and_app_metadata() -> None:
    batch = pa.record_batch({"x": [1, 2]})
    decoder = FlightDataDecoder()
    assert decoder.feed(pb.FlightData.FromString(encode_schema(batch.schema))) == []
    assert decoder.schema == batch.schema
    assert decoder.feed(pb.FlightData(app_metadata=b"only-meta")) == []
    got = decoder.feed(pb.FlightData.FromString(encode_batch(batch, app_metadata=b"m1")))
    assert [b.equals(batch) for b in got] == [True]
    assert decoder.app_metadata == [b"only-meta", b"m1"]


def test_decode_zero_row_batch() -> None:
    batch = pa.record_batch({"x": pa.array([], pa.int64())})
    _, _, out, _ = decode_flight_data_stream(_parse(list(encode_stream(batch.schema, [batch]))))
    assert out[0].equals(batch)


def test_decoder_accepts_pyarrow_ipc_stream_messages() -> None:
    # Frames produced by pyarrow's own IPC writer, not by our encoder.
    batches = [_dict_batch(i) for i in range(2)]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for b in batches:
            writer.write_batch(b)
    msgs = [
        pb.FlightData(data_header=m.metadata.to_pybytes(), data_body=m.body.to_pybytes())
        for m in pa.ipc.MessageReader.open_stream(sink.getvalue())
    ]
    _, _, out, _ = decode_flight_data_stream(msgs)
    assert [o.equals(b) for o, b in zip(out, batches, strict=True)] == [True, True]


def test_payload_cap() -> None:
    batch = pa.record_batch({"x": pa.array(range(1000), pa.int64())})
    msgs = _parse(list(encode_stream(batch.schema, [batch, batch])))
    size = sum(len(m.data_header) + len(m.data_body) for m in msgs)
    decode_flight_data_stream(msgs, max_bytes=size)
    with pytest.raises(PayloadTooLarge):
        decode_flight_data_stream(msgs, max_bytes=size - 1)

    class Custom(Exception):
        pass

    with pytest.raises(Custom):
        decode_flight_data_stream(msgs, max_bytes=100, too_large=Custom)


def test_rejects_malformed() -> None:
    batch = pa.record_batch({"x": [1, 2, 3]})
    schema_msg, batch_msg = _parse([encode_schema(batch.schema), encode_batch(batch)])
    with pytest.raises(InvalidFlightData, match="schema"):
        decode_flight_data_stream([batch_msg])
    with pytest.raises(InvalidFlightData):
        decode_flight_data_stream([schema_msg, pb.FlightData(data_header=b"\x01\x02")])
    short = pb.FlightData(data_header=batch_msg.data_header, data_body=batch_msg.data_body[:-8])
    with pytest.raises(InvalidFlightData, match="shorter"):
        decode_flight_data_stream([schema_msg, short])
    with pytest.raises(InvalidFlightData, match="no schema"):
        decode_flight_data_stream([])
    with pytest.raises(InvalidFlightData, match="second schema"):
        decode_flight_data_stream([schema_msg, schema_msg])


def _random_batches(rng: random.Random) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    """A random schema (plain, nested, nullable) and 1-4 batches of it, some large."""
    kinds: dict[str, Callable[[int], pa.Array]] = {
        "int64": lambda n: pa.array([rng.randrange(-(2**40), 2**40) for _ in range(n)], pa.int64()),
        "float64": lambda n: pa.array(
            [rng.random() if rng.random() > 0.2 else None for _ in range(n)], pa.float64()
        ),
        "bool": lambda n: pa.array([rng.random() > 0.5 for _ in range(n)], pa.bool_()),
        "string": lambda n: pa.array(["x" * rng.randrange(0, 9) for _ in range(n)], pa.string()),
        "binary": lambda n: pa.array(
            [rng.randbytes(rng.randrange(0, 5)) for _ in range(n)], pa.binary()
        ),
        "timestamp": lambda n: pa.array(
            [rng.randrange(0, 2**50) for _ in range(n)], pa.timestamp("us", tz="UTC")
        ),
        "list": lambda n: pa.array(
            [[rng.randrange(9)] * rng.randrange(3) for _ in range(n)], pa.list_(pa.int64())
        ),
        "struct": lambda n: pa.array(
            [{"uri": "s3://b/k", "size": rng.randrange(99)}] * n,
            pa.struct([("uri", pa.string()), ("size", pa.int64())]),
        ),
        "dictionary": lambda n: pa.array(
            ["a", "b"] * (n // 2) + ["c"] * (n % 2), pa.string()
        ).dictionary_encode(),
        # 16-byte values after a validity bitmap: Lance needs them 16-aligned.
        "decimal": lambda n: pa.array(
            [Decimal(rng.randrange(10**9)) / 100 if rng.random() > 0.3 else None for _ in range(n)],
            pa.decimal128(20, 2),
        ),
        "decimals": lambda n: pa.array(
            [[Decimal(rng.randrange(99)), None][: rng.randrange(3)] for _ in range(n)],
            pa.list_(pa.decimal256(40, 0)),
        ),
    }
    chosen = rng.sample(sorted(kinds), rng.randrange(1, 4))
    batches = []
    for _ in range(rng.randrange(1, 5)):
        # Now and then past DIRECT_MAX_BODY (1 MiB), so one stream mixes both paths.
        rows = rng.choice([0, 1, 3, 1000, 70_000]) if "list" not in chosen else rng.randrange(50)
        batches.append(pa.record_batch({name: kinds[name](rows) for name in chosen}))
    return batches[0].schema, batches


def _aligned_for_lance(batch: pa.RecordBatch) -> bool:
    """Every buffer of a batch holding decimals is 16-byte aligned."""
    if not any("decimal" in str(field.type) for field in batch.schema):
        return True
    return all(b is None or b.address % 16 == 0 for c in batch.columns for b in c.buffers())


def _outcome(messages: list[pb.FlightData]) -> list[pa.RecordBatch] | str:
    try:
        return decode_flight_data_stream(messages)[2]
    except InvalidFlightData:
        return "invalid"


def test_direct_batches_match_the_stream_reader_on_generated_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch read on its own (the small-append fast path) equals the stream reader's.

    Every generated stream, and copies of it with a flipped or dropped byte,
    decoded twice: as shipped, and with every batch forced through pyarrow's
    stream reader. Both must give equal batches, or both refuse the stream.
    """
    rng = random.Random(20261205)
    compared = refused = 0
    for _ in range(150):
        schema, batches = _random_batches(rng)
        messages = _parse(list(encode_stream(schema, batches)))
        variants = [messages]
        for _ in range(4):
            damaged = [pb.FlightData.FromString(m.SerializeToString()) for m in messages]
            target = damaged[rng.randrange(len(damaged))]
            field = rng.choice(["data_header", "data_body"])
            data = bytearray(getattr(target, field))
            if not data:
                continue
            at = rng.randrange(len(data))
            if rng.random() < 0.5:
                data[at] ^= 1 << rng.randrange(8)
            else:
                del data[at]
            setattr(target, field, bytes(data))
            variants.append(damaged)
        for variant in variants:
            fast = _outcome(variant)
            with monkeypatch.context() as forced:
                forced.setattr(encoding, "DIRECT_MAX_BODY", -1)
                slow = _outcome(variant)
            if isinstance(slow, str) or isinstance(fast, str):
                assert fast == slow
                refused += 1
                continue
            for batch in fast + slow:
                batch.validate(full=True)  # what the decoder hands on holds together
                assert _aligned_for_lance(batch)
            # Bit for bit (a damaged schema may decode as floats holding NaNs).
            assert [f.serialize() for f in fast] == [s.serialize() for s in slow]
            compared += 1
    # Both outcomes were exercised.
    assert compared > 200
    assert refused > 200


# --- proto compatibility with pyarrow's own (C++) Flight protobufs ---------


def test_flight_descriptor_compat() -> None:
    path = fl.FlightDescriptor.for_path("a", "b")
    for theirs in (path, fl.FlightDescriptor.for_command(b"\x00cmd")):
        ours = pb.FlightDescriptor.FromString(theirs.serialize())
        assert ours.SerializeToString() == theirs.serialize()
        assert fl.FlightDescriptor.deserialize(ours.SerializeToString()) == theirs
    assert list(pb.FlightDescriptor.FromString(path.serialize()).path) == ["a", "b"]


def test_ticket_and_action_compat() -> None:
    ticket = fl.Ticket(b"tkt\xff")
    assert pb.Ticket.FromString(ticket.serialize()).ticket == b"tkt\xff"
    assert fl.Ticket.deserialize(pb.Ticket(ticket=b"x").SerializeToString()).ticket == b"x"
    action = fl.Action("do-it", b"\x01body")
    ours = pb.Action.FromString(action.serialize())
    assert (ours.type, ours.body) == ("do-it", b"\x01body")
    back = fl.Action.deserialize(ours.SerializeToString())
    assert (back.type, back.body.to_pybytes()) == ("do-it", b"\x01body")


def test_flight_info_compat() -> None:
    schema = pa.schema([("x", pa.int64()), ("s", pa.string())])
    expires = pa.scalar(dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC), pa.timestamp("ns", "UTC"))
    endpoint = fl.FlightEndpoint(
        b"t1",
        ["grpc://h:1", "arrow-flight-reuse-connection://?"],
        expiration_time=expires,
        app_metadata=b"ep",
    )
    info = fl.FlightInfo(
        schema,
        fl.FlightDescriptor.for_path("p"),
        [endpoint],
        total_records=10,
        total_bytes=200,
        ordered=True,
        app_metadata=b"info",
    )
    ours = pb.FlightInfo.FromString(info.serialize())
    assert ours.flight_descriptor.path == ["p"]
    assert (ours.total_records, ours.total_bytes, ours.ordered) == (10, 200, True)
    assert ours.app_metadata == b"info"
    (ep,) = ours.endpoint
    assert (ep.ticket.ticket, ep.app_metadata) == (b"t1", b"ep")
    assert [loc.uri for loc in ep.location] == ["grpc://h:1", "arrow-flight-reuse-connection://?"]
    assert ep.expiration_time.seconds == int(expires.as_py().timestamp())
    assert pa.ipc.read_schema(pa.py_buffer(ours.schema)) == schema

    back = fl.FlightInfo.deserialize(ours.SerializeToString())
    assert back == info
    assert ours.SerializeToString() == info.serialize()


def test_flight_sql_messages_available() -> None:
    cmd = sql_pb.CommandStatementIngest(
        table="t",
        table_definition_options=sql_pb.CommandStatementIngest.TableDefinitionOptions(
            if_not_exist=sql_pb.CommandStatementIngest.TableDefinitionOptions.TABLE_NOT_EXIST_OPTION_CREATE,
        ),
        options={"k": "v"},
    )
    assert sql_pb.CommandStatementIngest.FromString(cmd.SerializeToString()) == cmd
    assert sql_pb.SqlInfo.Value("FLIGHT_SQL_SERVER_BULK_INGESTION") == 10
    assert sql_pb.DoPutUpdateResult(record_count=3).record_count == 3
    assert sql_pb.DESCRIPTOR.extensions_by_name["experimental"].number == 1000
    # Session options live in Flight.proto.
    req = pb.SetSessionOptionsRequest(session_options={"a": pb.SessionOptionValue(int64_value=-1)})
    assert pb.SetSessionOptionsRequest.FromString(req.SerializeToString()) == req


def test_generated_modules_need_no_grpc_tools() -> None:
    src = Path(__file__).resolve().parents[1] / "src"
    code = (
        "import sys; sys.modules['grpc_tools'] = None\n"
        "from lake_core.proto import flight_pb2, flight_sql_pb2, flight_grpc\n"
        "assert flight_grpc.FlightServiceStub\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(src)})
