"""Result parts: the bounded writer and the framing check that guards every served part."""

from __future__ import annotations

import asyncio
import functools
import hmac
import random
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.poly1305 import Poly1305

from lake_core.errors import (
    DataCorrupted,
    FailedPrecondition,
    QueryCancelled,
    ResultTooLarge,
    Unavailable,
)
from lake_core.tickets import TicketKeyRing
from lake_query.jobs import results
from lake_query.jobs.framing import MAX_METADATA_BYTES, checked_frames, checked_messages
from lake_query.jobs.parts import write_parts
from lake_query.jobs.results import LocalResults
from lake_query.jobs.tags import PartTag, PartTags

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.utf8())])
RING = TicketKeyRing.ephemeral()
TAGS = PartTags(RING)
JOB, ATTEMPT = "0" * 31 + "1", 1


def _tag(data: bytes, index: int = 0) -> PartTag:
    tagger = TAGS.tagger(JOB, ATTEMPT, index)
    tagger.update(data)
    return tagger.finish()


def _carries(data: bytes, tag: PartTag, index: int = 0) -> bool:
    checker = TAGS.checker(JOB, ATTEMPT, index, tag)
    checker.update(data)
    return checker.matches()


def _batches(count: int, rows: int = 1000) -> list[pa.RecordBatch]:
    return [
        pa.record_batch(
            [
                pa.array(range(i * rows, (i + 1) * rows)),
                pa.array([f"row {j}" for j in range(rows)]),
            ],
            schema=SCHEMA,
        )
        for i in range(count)
    ]


def _write(
    root: Path, batches: list[pa.RecordBatch], schema: pa.Schema = SCHEMA, **limits: int
) -> list:  # type: ignore[type-arg]
    store = LocalResults(root)
    with ThreadPoolExecutor(4) as pool:
        return asyncio.run(
            write_parts(
                schema,
                lambda: iter(batches),
                store,
                "job/1",
                pool,
                threading.Event(),
                part_bytes=limits.get("part_bytes", 64 * 1024 * 1024),
                max_result_bytes=limits.get("max_result_bytes", 1 << 30),
                tagger=functools.partial(TAGS.tagger, JOB, ATTEMPT),
            )
        )


async def _chunks(data: bytes, size: int = 7000) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _serve(data: bytes, size: int | None = None, tag: PartTag | None = None) -> pa.Table:
    """Serve a part as DoGet would, then decode what a client receives.

    Both serving paths run (S3's async chunks, and the local reader thread's
    blocking ones, in another chunk size) and must agree: the same messages,
    or the same refusal.
    """
    size = len(data) if size is None else size
    tag = tag or _tag(data)

    async def collect() -> list[bytes]:
        checker = TAGS.checker(JOB, ATTEMPT, 0, tag)
        return [m async for m in checked_messages(_chunks(data), size, checker)]

    def blocking() -> list[bytes]:
        chunks = (data[at : at + 65536] for at in range(0, len(data), 65536))
        return list(checked_frames(chunks, size, TAGS.checker(JOB, ATTEMPT, 0, tag)))

    outcomes: list[list[bytes] | Exception] = []
    for serve in (lambda: asyncio.run(collect()), blocking):
        try:
            outcomes.append(serve())
        except Exception as exc:
            outcomes.append(exc)
    streamed, read = outcomes
    if isinstance(streamed, Exception):
        assert type(read) is type(streamed), (streamed, read)
        raise streamed
    assert read == streamed
    messages = streamed
    from lake_core.flight.encoding import decode_flight_data_stream
    from lake_core.proto import flight_pb2

    _, schema, batches, _ = decode_flight_data_stream(
        flight_pb2.FlightData.FromString(m) for m in messages
    )
    return pa.Table.from_batches(batches, schema=schema)


def test_parts_respect_the_part_ceiling_and_round_trip(tmp_path: Path) -> None:
    batches = _batches(40)
    parts = _write(tmp_path, batches, part_bytes=100_000)
    assert 3 < len(parts) <= 10  # full parts, not one per batch (or per row)
    assert sum(p.rows for p in parts) == 40_000
    served = []
    for index, part in enumerate(parts):
        data = (tmp_path / "job/1" / part.name).read_bytes()
        assert len(data) == part.bytes <= 100_000
        assert _carries(data, part.tag, index)
        served.append(_serve(data))
    assert pa.concat_tables(served).equals(pa.Table.from_batches(batches))
    assert not list(tmp_path.rglob("*.tmp"))


def test_dictionary_columns_round_trip_with_replacement_dictionaries(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("robot", pa.dictionary(pa.int32(), pa.utf8()))])
    batches = [
        pa.record_batch(
            [
                pa.array(range(i * 100, (i + 1) * 100)),
                # Each batch encodes its own dictionary: later ones replace earlier ones.
                pa.array([f"robot-{(i + j) % (i + 2)}" for j in range(100)]).dictionary_encode(),
            ],
            schema=schema,
        )
        for i in range(5)
    ]
    parts = _write(tmp_path, batches, schema)
    served = pa.concat_tables(_serve((tmp_path / "job/1" / p.name).read_bytes()) for p in parts)
    assert served.equals(pa.Table.from_batches(batches))


def test_a_result_over_its_byte_ceiling_is_refused_before_publication(tmp_path: Path) -> None:
    with pytest.raises(ResultTooLarge):
        _write(tmp_path, _batches(40), part_bytes=100_000, max_result_bytes=200_000)
    # Parts already complete stay unnamed (no manifest); the unfinished one never appears.
    assert not list(tmp_path.rglob("*.tmp"))


def test_cancellation_stops_the_encoder(tmp_path: Path) -> None:
    stop = threading.Event()

    def endless() -> Iterator[pa.RecordBatch]:
        for batch in iter(lambda: _batches(1)[0], None):
            stop.set()
            yield batch

    with ThreadPoolExecutor(4) as pool, pytest.raises(QueryCancelled):
        asyncio.run(
            write_parts(
                SCHEMA,
                endless,
                LocalResults(tmp_path),
                "job/1",
                pool,
                stop,
                part_bytes=1 << 20,
                max_result_bytes=1 << 30,
                tagger=functools.partial(TAGS.tagger, JOB, ATTEMPT),
            )
        )


@pytest.fixture
def part(tmp_path: Path) -> bytes:
    [only] = _write(tmp_path, _batches(3))
    return (tmp_path / "job/1" / only.name).read_bytes()


def test_a_corrupted_part_is_refused(part: bytes) -> None:
    damaged = bytearray(part)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(DataCorrupted):
        _serve(bytes(damaged), len(part), _tag(part))


def test_a_truncated_part_is_refused(part: bytes) -> None:
    with pytest.raises(DataCorrupted):
        _serve(part[: len(part) - 100], len(part), _tag(part))


def test_an_over_long_part_is_refused(part: bytes) -> None:
    with pytest.raises(DataCorrupted):
        _serve(part + b"\0" * 64, len(part), _tag(part))


def test_oversized_metadata_is_refused_before_decoding() -> None:
    # A frame announcing more metadata than the bound: refused on the 8-byte prefix alone.
    frame = b"\xff\xff\xff\xff" + (MAX_METADATA_BYTES + 8).to_bytes(4, "little") + b"\0" * 64
    with pytest.raises(DataCorrupted):
        _serve(frame, MAX_METADATA_BYTES * 4)


def test_an_impossible_body_length_is_refused(part: bytes) -> None:
    # Rewrite the first record batch's bodyLength to exceed the part.
    schema_len = int.from_bytes(part[4:8], "little")
    batch_at = 8 + schema_len
    metadata_len = int.from_bytes(part[batch_at + 4 : batch_at + 8], "little")
    metadata = bytearray(part[batch_at + 8 : batch_at + 8 + metadata_len])
    from lake_query.jobs.framing import _Table

    message = _Table(bytes(metadata), int.from_bytes(metadata[0:4], "little"))
    at = message.pos + message.offset(3)
    metadata[at : at + 8] = (1 << 40).to_bytes(8, "little")
    forged = part[: batch_at + 8] + bytes(metadata) + part[batch_at + 8 + metadata_len :]
    with pytest.raises(DataCorrupted):
        _serve(forged)


def test_compressed_ipc_is_refused_before_decoding() -> None:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, SCHEMA, options=options) as writer:
        for batch in _batches(2):
            writer.write_batch(batch)
    with pytest.raises(DataCorrupted):
        _serve(sink.getvalue().to_pybytes())


def test_early_writeback_leaves_a_parts_bytes_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handing written ranges to the disk early (Linux) changes no byte and no digest."""
    start = results._START_WRITEBACK
    if sys.platform.startswith("linux"):
        assert start is not None
    handed: list[tuple[int, int]] = []

    def counted(fd: int, offset: int, length: int) -> None:
        handed.append((offset, length))
        if start is not None:
            start(fd, offset, length)

    batches = _batches(60)
    monkeypatch.setattr(results, "WRITEBACK_BYTES", 64 * 1024)
    monkeypatch.setattr(results, "_START_WRITEBACK", counted)
    early = _write(tmp_path / "early", batches, part_bytes=1 << 20)
    monkeypatch.setattr(results, "_START_WRITEBACK", None)
    plain = _write(tmp_path / "plain", batches, part_bytes=1 << 20)
    assert len(early) > 1
    assert len(handed) > len(early)
    # Same bytes in the same parts (the tags differ: every part has its own nonce).
    assert [(p.name, p.bytes, p.rows) for p in early] == [(p.name, p.bytes, p.rows) for p in plain]
    for index, part in enumerate(early):
        data = (tmp_path / "early/job/1" / part.name).read_bytes()
        assert data == (tmp_path / "plain/job/1" / part.name).read_bytes()
        assert _carries(data, part.tag, index)


def test_a_tag_is_poly1305_under_the_derived_key_whatever_the_update_sizes() -> None:
    """Differential against a one-shot Poly1305 of the whole part, under the key derivation
    spelled out here (stored results depend on it not changing)."""
    rng = random.Random(12)
    for index in range(20):
        pieces = [rng.randbytes(rng.choice([0, 1, 15, 16, 17, 70_000])) for _ in range(30)]
        tagger = TAGS.tagger(JOB, ATTEMPT, index)
        for piece in pieces:
            tagger.update(memoryview(piece))
        tag = tagger.finish()
        assert tag.key_id == RING.active_id
        info = b"lake-async-part\0%s\0%d\0%d\0" % (JOB.encode(), ATTEMPT, index)
        key = hmac.digest(RING.keys[tag.key_id], info + bytes.fromhex(tag.nonce), "sha256")
        whole = b"".join(pieces)
        assert Poly1305.generate_tag(key, whole).hex() == tag.mac
        assert _carries(whole, tag, index)


def test_a_tag_binds_its_key_its_nonce_and_the_parts_place() -> None:
    data = random.Random(3).randbytes(10_000)
    tag = _tag(data, index=2)
    assert _carries(data, tag, 2)
    again = _tag(data, index=2)
    # A fresh one-time key each time.
    assert again.nonce != tag.nonce
    assert again.mac != tag.mac
    for job, attempt, index in ((JOB, ATTEMPT, 1), (JOB, ATTEMPT + 1, 2), ("f" * 32, ATTEMPT, 2)):
        checker = TAGS.checker(job, attempt, index, tag)
        checker.update(data)
        assert not checker.matches(), (job, attempt, index)
    flipped = tag.model_copy(update={"nonce": f"{int(tag.nonce[0], 16) ^ 1:x}" + tag.nonce[1:]})
    assert not _carries(data, flipped, 2)
    other = PartTags(TicketKeyRing.ephemeral())  # the same key id, another key
    checker = other.checker(JOB, ATTEMPT, 2, tag)
    checker.update(data)
    assert not checker.matches()
    with pytest.raises(FailedPrecondition):
        TAGS.checker(JOB, ATTEMPT, 2, tag.model_copy(update={"key_id": "retired"}))


def test_a_parts_tag_does_not_vouch_for_another_parts_bytes(tmp_path: Path) -> None:
    """Parts swapped between positions fail the check, each well-framed on its own."""
    parts = _write(tmp_path, _batches(40), part_bytes=100_000)
    first, second = ((tmp_path / "job/1" / p.name).read_bytes() for p in parts[:2])
    assert _carries(first, parts[0].tag, 0)
    assert not _carries(second, parts[0].tag, 0)
    assert not _carries(first, parts[0].tag, 1)
    with pytest.raises(DataCorrupted):
        _serve(second, len(second), parts[0].tag)


def test_the_channel_keeps_order_and_its_bound_and_a_stop_frees_both_ends() -> None:
    from lake_query.jobs.parts import CHANNEL_SLOTS, _Channel, _Failed

    rng = random.Random(5)
    stop = threading.Event()
    channel = _Channel(stop)
    seen_outstanding: list[int] = []

    def produce() -> None:
        for item in range(500):
            if rng.random() < 0.05:
                threading.Event().wait(0.001)
            channel.put(item)
            seen_outstanding.append(channel._outstanding)
        channel.final("end")

    producer = threading.Thread(target=produce)
    producer.start()
    got = []
    while (item := channel.get()) != "end":
        got.append(item)
        if rng.random() < 0.05:
            threading.Event().wait(0.001)
    producer.join(10)
    assert got == list(range(500))
    assert max(seen_outstanding) <= CHANNEL_SLOTS

    # A full channel: the blocked encoder gives up on stop; the writer sees the failure.
    for item in range(CHANNEL_SLOTS):
        channel.put(item)
    failures: list[BaseException] = []

    def blocked() -> None:
        try:
            channel.put("one too many")
        except QueryCancelled as exc:
            failures.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    threading.Event().wait(0.1)
    assert thread.is_alive()  # waiting for the slots to drain
    stop.set()
    thread.join(5)
    assert failures
    channel.final("dropped")  # nobody listens any more: returns at once
    assert [channel.get() for _ in range(CHANNEL_SLOTS)] == list(range(CHANNEL_SLOTS))
    assert isinstance(channel.get(), _Failed)


def test_the_first_part_is_stored_while_the_query_still_executes(tmp_path: Path) -> None:
    """Execution and storage overlap: the query's last batch waits for a stored first part.

    Were the parts stored only after the query ended, the source would never
    see one and the write would fail with its assertion.
    """
    batches = _batches(40)
    first = tmp_path / "job/1/part-00000.arrows"
    seen: list[bool] = []

    def source() -> Iterator[pa.RecordBatch]:
        yield from batches[:-1]
        deadline = time.monotonic() + 60
        while not first.exists():
            assert time.monotonic() < deadline, "no part was stored while the query executed"
            time.sleep(0.01)
        seen.append(True)
        yield batches[-1]

    store = LocalResults(tmp_path)
    with ThreadPoolExecutor(4) as pool:
        parts = asyncio.run(
            write_parts(
                SCHEMA,
                source,
                store,
                "job/1",
                pool,
                threading.Event(),
                part_bytes=100_000,
                max_result_bytes=1 << 30,
                tagger=functools.partial(TAGS.tagger, JOB, ATTEMPT),
            )
        )
    assert seen == [True]
    assert len(parts) > 3
    served = [
        _serve_at((tmp_path / "job/1" / p.name).read_bytes(), p.tag, i) for i, p in enumerate(parts)
    ]
    assert pa.concat_tables(served).equals(pa.Table.from_batches(batches))


def _serve_at(data: bytes, tag: PartTag, index: int) -> pa.Table:
    assert _carries(data, tag, index)
    with pa.ipc.open_stream(data) as reader:
        return reader.read_all()


def test_the_execution_queue_keeps_order_and_its_byte_bound_and_a_stop_frees_it() -> None:
    from lake_query.jobs.parts import _Ahead

    limit = 100_000
    stop = threading.Event()
    ahead = _Ahead(stop, limit)
    batches = _batches(30)
    size = batches[0].get_total_buffer_size()
    huge = _batches(1, rows=20_000)[0]  # alone over the bound: passes, alone
    assert huge.get_total_buffer_size() > limit
    queued: list[int] = []
    closed_on: list[int] = []

    def query() -> Iterator[pa.RecordBatch]:
        try:
            for batch in [*batches, huge, *batches]:
                yield batch
                queued.append(ahead._bytes)
            raise ResultTooLarge("the query's own error, after its batches")
        finally:
            closed_on.append(threading.get_ident())

    executing = threading.Thread(target=ahead.run, args=(query,))
    executing.start()
    got: list[pa.RecordBatch] = []

    def encode() -> None:
        for batch in ahead:
            got.append(batch)
            if len(got) % 7 == 0:
                time.sleep(0.01)  # a slow encoder now and then: the queue fills

    with pytest.raises(ResultTooLarge):
        encode()
    executing.join(10)
    assert got == [*batches, huge, *batches]
    # Within the bound, but for the batch over it, which waited for an empty queue.
    assert max(queued) > limit // 2
    assert all(q <= limit or q == huge.get_total_buffer_size() for q in queued)
    assert closed_on == [executing.ident]  # the stream ends on the thread that ran it

    # A full queue and an encoder gone: the stop frees the executing thread and closes the query.
    stop_two = threading.Event()
    blocked = _Ahead(stop_two, limit)
    closed_on.clear()

    def endless() -> Iterator[pa.RecordBatch]:
        try:
            while True:
                yield batches[0]
        finally:
            closed_on.append(threading.get_ident())

    thread = threading.Thread(target=blocked.run, args=(endless,))
    thread.start()
    deadline = time.monotonic() + 30
    while blocked._bytes + size <= limit:  # until the queue is full
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert blocked._bytes <= limit
    stop_two.set()
    thread.join(10)
    assert not thread.is_alive()
    assert closed_on == [thread.ident]
    with pytest.raises(QueryCancelled):
        list(blocked)


def test_a_part_failing_midway_stops_the_query_and_leaves_no_object(tmp_path: Path) -> None:
    """Storage refusing the second part mid-write: its error, nothing named, the query closed."""
    begun: list[int] = []
    closed: list[bool] = []

    def midway() -> None:
        begun.append(1)
        if len(begun) == 2:
            raise Unavailable("object storage did not accept an async result part")

    def endless() -> Iterator[pa.RecordBatch]:
        try:
            yield from iter(lambda: _batches(1)[0], None)
        finally:
            closed.append(True)

    with ThreadPoolExecutor(4) as pool, pytest.raises(Unavailable):
        asyncio.run(
            write_parts(
                SCHEMA,
                endless,
                LocalResults(tmp_path),
                "job/1",
                pool,
                threading.Event(),
                part_bytes=100_000,
                max_result_bytes=1 << 30,
                tagger=functools.partial(TAGS.tagger, JOB, ATTEMPT),
                midway=midway,
            )
        )
    assert closed == [True]  # an endless query was stopped, and closed, before the return
    assert [p.name for p in (tmp_path / "job/1").iterdir()] == ["part-00000.arrows"]
