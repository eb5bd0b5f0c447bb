"""Whole-object local reads: one chunk read ahead while the last is hashed, every check kept."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path
from typing import BinaryIO

import pytest

from lake_core.models import DataLocation
from lake_objects import (
    FileUpload,
    HashMismatch,
    ObjectOverlong,
    PrematureEof,
    StageSettings,
    open_store,
)
from lake_objects import local as local_module
from lake_objects.local import LocalObjectStore
from lake_objects.store import ManagedObjectStore

CHUNK = 64 * 1024


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_module, "LOCAL_CHUNK_SIZE", CHUNK)


def _store(tmp_path: Path) -> ManagedObjectStore:
    return open_store(StageSettings.local(tmp_path / "objects").descriptor("acme"))


async def _stored(tmp_path: Path, data: bytes) -> tuple[ManagedObjectStore, DataLocation, Path]:
    store = _store(tmp_path)
    source = tmp_path / "src.bin"
    source.write_bytes(data)
    location = await store.upload(FileUpload.from_path(source, "video/mp4"))
    return store, location, Path(location.uri.removeprefix("file://"))


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 7])
async def test_every_size_reads_back_verified(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    store, location, _ = await _stored(tmp_path, data)
    reader = await store.open(location)
    chunks = [chunk async for chunk in reader]
    assert b"".join(chunks) == data
    assert all(len(chunk) == CHUNK for chunk in chunks[:-1])
    assert reader.verified
    assert (await store.open(location)).verified is False  # only a drained reader proves it


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("size", [3 * CHUNK, 3 * CHUNK + 5])
async def test_a_flipped_byte_in_any_chunk_fails_at_the_end(
    tmp_path: Path, where: str, size: int
) -> None:
    data = bytearray(os.urandom(size))
    store, location, path = await _stored(tmp_path, bytes(data))
    at = {"first": 3, "middle": CHUNK + CHUNK // 2, "last": size - 1}[where]
    data[at] ^= 0x01
    path.write_bytes(data)
    reader = await store.open(location)
    seen: list[int] = []

    async def drain() -> None:
        async for chunk in reader:
            seen.append(len(chunk))

    with pytest.raises(HashMismatch):
        await drain()
    assert sum(seen) == size  # every byte passed; the end was never reported clean
    assert not reader.verified


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body_size", "error"),
    [
        (2 * CHUNK, PrematureEof),  # cut at a chunk boundary
        (2 * CHUNK + 1, PrematureEof),
        (3 * CHUNK + 1, ObjectOverlong),  # one byte past an exact multiple
        (4 * CHUNK, ObjectOverlong),
    ],
)
async def test_wrong_lengths_fail_typed(tmp_path: Path, body_size: int, error: type) -> None:
    data = os.urandom(3 * CHUNK)
    store, location, path = await _stored(tmp_path, data)
    path.write_bytes((data * 2)[:body_size])
    reader = await store.open(location)
    with pytest.raises(error):
        await reader.read()
    assert not reader.verified


class _GatedFile:
    """A real file whose second read blocks until ``gate`` is set, recording what happens."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.gate = threading.Event()
        self.second_read_entered = threading.Event()
        self.reads = 0
        self.reading = False
        self.closed_while_reading = False
        self.read_after_close = False

    def read(self, size: int = -1) -> bytes:
        if self._file.closed:
            self.read_after_close = True
        self.reads += 1
        self.reading = True
        try:
            if self.reads == 2:
                self.second_read_entered.set()
                assert self.gate.wait(10), "the test never opened the gate"
            return self._file.read(size)
        finally:
            self.reading = False

    def fileno(self) -> int:
        return self._file.fileno()

    def seek(self, offset: int) -> int:
        return self._file.seek(offset)

    def close(self) -> None:
        self.closed_while_reading |= self.reading
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> list[_GatedFile]:
    opened: list[_GatedFile] = []
    real_open = LocalObjectStore._open_file

    async def open_gated(self: LocalObjectStore, name: str) -> BinaryIO:
        file = _GatedFile(await real_open(self, name))
        opened.append(file)
        return file  # type: ignore[return-value]

    monkeypatch.setattr(LocalObjectStore, "_open_file", open_gated)
    return opened


@pytest.mark.asyncio
async def test_aclose_waits_for_the_read_ahead_then_closes(
    tmp_path: Path, gated: list[_GatedFile]
) -> None:
    data = os.urandom(4 * CHUNK)
    store, location, _ = await _stored(tmp_path, data)
    reader = await store.open(location)
    chunks = aiter(reader)
    assert await anext(chunks) == data[:CHUNK]
    file = gated[0]
    # The next chunk is being read before it was asked for, and only that one.
    assert await asyncio.to_thread(file.second_read_entered.wait, 10)
    await asyncio.sleep(0.05)
    assert file.reads == 2
    closing = asyncio.create_task(reader.aclose())
    await asyncio.sleep(0.05)
    assert not closing.done()
    assert not file.closed  # a running read is not pulled from under
    file.gate.set()
    await asyncio.wait_for(closing, 10)
    assert file.closed
    assert not file.closed_while_reading
    assert not file.read_after_close
    assert file.reads == 2
    assert not reader.verified
    with pytest.raises(ValueError, match="closed"):
        await reader._chunks.__anext__()  # a closed stream never ends cleanly


@pytest.mark.asyncio
async def test_a_cancelled_consumer_leaves_no_read_behind(
    tmp_path: Path, gated: list[_GatedFile]
) -> None:
    data = os.urandom(4 * CHUNK)
    store, location, _ = await _stored(tmp_path, data)
    reader = await store.open(location)

    async def consume() -> None:
        async for _ in reader:
            await asyncio.sleep(0)

    consumer = asyncio.create_task(consume())
    file_entered = await asyncio.to_thread(_wait_for_second_read, gated)
    assert file_entered
    consumer.cancel()
    await asyncio.sleep(0.05)
    file = gated[0]
    assert not file.closed  # the reader's close waits for the running read ...
    file.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(consumer, 10)
    assert file.closed  # ... and then closes the file
    assert not file.closed_while_reading
    assert not file.read_after_close
    assert not reader.verified


def _wait_for_second_read(gated: list[_GatedFile]) -> bool:
    return any(gated and gated[0].second_read_entered.wait(0.01) for _ in range(1000))


@pytest.mark.asyncio
async def test_range_reads_do_not_read_ahead(tmp_path: Path, gated: list[_GatedFile]) -> None:
    data = os.urandom(4 * CHUNK)
    store, location, _ = await _stored(tmp_path, data)
    reader = await store.open_range(location, 10, 3 * CHUNK)
    chunks = aiter(reader)
    assert await anext(chunks) == data[10 : 10 + CHUNK]
    await asyncio.sleep(0.05)
    assert gated[0].reads == 1
    gated[0].gate.set()
    rest = b"".join([chunk async for chunk in chunks])
    assert rest == data[10 + CHUNK : 3 * CHUNK]
    assert hashlib.sha256(data).hexdigest() == location.sha256


@pytest.mark.asyncio
async def test_reads_and_hashes_run_on_one_thread_of_the_readers_own_stopped_at_the_end(
    tmp_path: Path, gated: list[_GatedFile]
) -> None:
    data = os.urandom(5 * CHUNK + 3)
    store, location, _ = await _stored(tmp_path, data)
    reader = await store.open(location)
    gated[0].gate.set()
    readers: set[str] = set()
    real_read = gated[0].read

    def recording_read(size: int = -1) -> bytes:
        readers.add(threading.current_thread().name)
        return real_read(size)

    gated[0].read = recording_read  # type: ignore[method-assign]
    assert b"".join([chunk async for chunk in reader]) == data
    assert reader.verified
    # One thread read every chunk (and hashed it: the hash is proved above).
    assert len(readers) == 1
    (name,) = readers
    assert name.startswith("lake-verified-read")
    for _ in range(500):  # stopped once the end was reached
        if not any(t.name == name for t in threading.enumerate()):
            break
        await asyncio.sleep(0.01)
    assert not any(t.name == name for t in threading.enumerate())


# -- copy_to: a whole local object copied in one blocking call (read, hash, write overlapped) --


class _Recording:
    """A binary destination that records which threads wrote what, and can fail a write."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.data = bytearray()
        self.writers: set[str] = set()
        self.fail_at = fail_at
        self.writes = 0

    def write(self, data: bytes | memoryview) -> int:
        self.writes += 1
        if self.fail_at is not None and self.writes == self.fail_at:
            raise OSError(28, "No space left on device")
        self.writers.add(threading.current_thread().name)
        self.data += data
        return len(data)


@pytest.fixture
def drains(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """What each HashedFileChunks.drain_into returned (proves the one-call path ran)."""
    results: list[int | None] = []
    real = local_module.HashedFileChunks.drain_into

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        result = real(self, *args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(local_module.HashedFileChunks, "drain_into", recording)
    return results


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 7 * CHUNK + 5])
async def test_copy_to_drains_every_size_verified(
    tmp_path: Path, size: int, drains: list[int | None]
) -> None:
    data = os.urandom(size)
    store, location, _ = await _stored(tmp_path, data)
    out = _Recording()
    reader = await store.open(location)
    assert await reader.copy_to(out) == size  # type: ignore[arg-type]
    assert bytes(out.data) == data
    assert reader.verified
    assert drains == [size]
    if size:  # written by the drain's own writer thread, beside the read and hash
        assert out.writers
        assert all(n.startswith("lake-verified-write") for n in out.writers)
    target = tmp_path / "copy.bin"
    assert await (await store.open(location)).copy_to(target, durable=False) == size
    assert target.read_bytes() == data
    assert drains == [size, size]


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["first", "middle", "last"])
async def test_copy_to_a_path_with_a_flipped_byte_leaves_nothing(
    tmp_path: Path, where: str, drains: list[int | None]
) -> None:
    size = 5 * CHUNK + 5
    data = bytearray(os.urandom(size))
    store, location, path = await _stored(tmp_path, bytes(data))
    data[{"first": 0, "middle": 2 * CHUNK + 9, "last": size - 1}[where]] ^= 0x80
    path.write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    reader = await store.open(location)
    with pytest.raises(HashMismatch):
        await reader.copy_to(out / "copy.bin", durable=False)
    assert not reader.verified
    assert drains == [size]  # every byte was read and hashed
    assert list(out.iterdir()) == []  # no copy, no temporary file


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body_size", "error"),
    [
        (2 * CHUNK, PrematureEof),
        (2 * CHUNK + 1, PrematureEof),
        (3 * CHUNK + 1, ObjectOverlong),
        (5 * CHUNK, ObjectOverlong),
    ],
)
async def test_copy_to_wrong_lengths_fail_typed_and_write_nothing_beyond(
    tmp_path: Path, body_size: int, error: type
) -> None:
    data = os.urandom(3 * CHUNK)
    store, location, path = await _stored(tmp_path, data)
    path.write_bytes((data * 2)[:body_size])
    sink = _Recording()
    with pytest.raises(error):
        await (await store.open(location)).copy_to(sink)  # type: ignore[arg-type]
    assert len(sink.data) <= 3 * CHUNK  # never a byte past the declared length
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(error):
        await (await store.open(location)).copy_to(out / "copy.bin")
    assert list(out.iterdir()) == []


@pytest.mark.asyncio
async def test_copy_to_a_failed_write_stops_the_copy_and_leaves_no_thread(tmp_path: Path) -> None:
    data = os.urandom(6 * CHUNK)
    store, location, _ = await _stored(tmp_path, data)
    sink = _Recording(fail_at=2)
    reader = await store.open(location)
    with pytest.raises(OSError, match="No space"):
        await reader.copy_to(sink)  # type: ignore[arg-type]
    assert not reader.verified
    assert not any(t.name.startswith("lake-verified-write") for t in threading.enumerate())
    assert reader._closed  # the source file was closed after the writer stopped


@pytest.mark.asyncio
async def test_a_cancelled_copy_to_stops_between_pieces_and_closes_after(tmp_path: Path) -> None:
    data = os.urandom(8 * CHUNK)
    store, location, _ = await _stored(tmp_path, data)
    entered, gate = threading.Event(), threading.Event()

    class Blocking(_Recording):
        def write(self, data: bytes | memoryview) -> int:
            entered.set()
            assert gate.wait(10), "the test never opened the gate"
            return super().write(data)

    sink = Blocking()
    reader = await store.open(location)
    copying = asyncio.create_task(reader.copy_to(sink))  # type: ignore[arg-type]
    assert await asyncio.to_thread(entered.wait, 10)
    copying.cancel()
    await asyncio.sleep(0.05)
    assert not copying.done()  # it waits for the write under way ...
    assert not reader._closed  # ... before it closes the object's file
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(copying, 10)
    assert reader._closed
    assert not reader.verified
    assert len(sink.data) < len(data)  # it stopped early
    assert not any(t.name.startswith("lake-verified-write") for t in threading.enumerate())
