"""ObjectFile against io.BytesIO (the stdlib's file over the same bytes), and its cache's plan.

The fetcher here serves ranges of an in-memory object on a real event-loop
thread, so the sync/async bridge is the one clients use; tests over real
stages are in tests/training.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
from collections.abc import Iterator

import pytest

from lake_core.errors import FailedPrecondition, InvalidArgument
from lake_core.models import DataLocation
from lake_objects.errors import HashMismatch
from lake_sdk import ObjectFile
from lake_sdk._block_cache import BlockCache, CacheLimits
from tools.lake_testing.loops import loop_on_thread

KIB = 1024


class Ranges:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []
        self.closed = False

    async def fetch(self, start: int, end: int) -> bytes:
        assert 0 <= start < end <= len(self.data)
        self.calls.append((start, end))
        return self.data[start:end]

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    with loop_on_thread() as running:
        yield running


def _location(data: bytes, sha256: str | None = None) -> DataLocation:
    return DataLocation(
        uri="file:///stage/tenants/t/objects/o",
        media_type="application/octet-stream",
        size_bytes=len(data),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
    )


def _open(
    loop: asyncio.AbstractEventLoop, data: bytes, sha256: str | None = None, **limits: int
) -> tuple[ObjectFile, Ranges]:
    ranges = Ranges(data)
    limits = {"block_size": 64 * KIB, "cache_bytes": 256 * KIB, **limits}
    return ObjectFile(_location(data, sha256), ranges, loop, CacheLimits.create(**limits)), ranges


@pytest.mark.parametrize("seed", range(4))
def test_every_operation_agrees_with_bytesio(loop: asyncio.AbstractEventLoop, seed: int) -> None:
    rng = random.Random(seed)
    data = b"".join(
        rng.choice([b"\n", b"line ", rng.randbytes(rng.randint(1, 5000))]) for _ in range(600)
    )
    file, _ = _open(loop, data)
    ref = io.BytesIO(data)
    for step in range(2000):
        op = rng.choice(["seek", "read", "readinto", "readline", "read1", "tell", "peek"])
        if op == "seek":
            whence = rng.choice((0, 1, 2))
            offset = rng.randint(-len(data) // 2, len(data) + 100)
            if whence == 0:
                offset = abs(offset)
            try:
                expected: object = ref.seek(offset, whence)
            except ValueError:
                with pytest.raises(ValueError):
                    file.seek(offset, whence)
                continue
            assert file.seek(offset, whence) == expected, step
        elif op == "read":
            size = rng.choice([-1, None, 0, 1, rng.randint(1, 300 * KIB)]) if step % 50 else -1
            assert file.read(size) == ref.read(size), (step, size)
        elif op == "readinto":
            a, b = bytearray(rng.randint(0, 90 * KIB)), None
            b = bytearray(len(a))
            assert file.readinto(a) == ref.readinto(b), step
            assert a == b, step
        elif op == "readline":
            limit = rng.choice([-1, rng.randint(0, 10_000)])
            assert file.readline(limit) == ref.readline(limit), step
        elif op == "read1":
            size = rng.randint(0, 100 * KIB)
            assert file.read1(size) == ref.read(size), step
        elif op == "peek":
            here = ref.tell()
            peeked = file.peek()
            assert data[here : here + len(peeked)] == peeked, step
            assert bool(peeked) == (here < len(data)), step
        assert file.tell() == ref.tell(), (step, op)
        assert file.peak_cached_bytes <= 256 * KIB
    file.seek(0)
    assert list(file) == io.BytesIO(data).readlines()
    file.close()


def test_read_ahead_grows_with_the_sequential_run_and_a_seek_resets_it() -> None:
    data = bytes(8 * 1024 * KIB)
    cache = BlockCache(
        _location(data), CacheLimits.create(block_size=64 * KIB, cache_bytes=2048 * KIB)
    )
    assert cache.limits.read_ahead == 1024 * KIB  # half the cache: less than 8 MiB
    cache.note_read(0)
    assert cache.plan(0, 100)[1] == [(0, 64 * KIB)]  # a first read: one block
    cache.store(0, data[: 64 * KIB], range(1))
    cache.note_consumed(0, 64 * KIB)
    cache.note_read(64 * KIB)
    assert cache.plan(64 * KIB, 100)[1] == [(64 * KIB, 192 * KIB)]  # 1 block + 64 KiB run ahead
    cache.note_read(5 * 1024 * KIB)  # a seek
    assert cache.plan(5 * 1024 * KIB, 10)[1] == [(5 * 1024 * KIB, 5 * 1024 * KIB + 64 * KIB)]


def test_a_sequential_read_proves_the_hash_and_a_wrong_one_fails(
    loop: asyncio.AbstractEventLoop,
) -> None:
    data = random.Random(1).randbytes(1000 * KIB + 3)
    file, ranges = _open(loop, data)
    file.seek(900 * KIB)
    file.read(10)
    file.seek(0)
    assert file.read() == data
    assert file.verified
    assert ranges.calls  # and nothing was fetched that was not asked for
    file.close()
    assert ranges.closed
    bad, _ = _open(loop, data, sha256="0" * 64)
    with pytest.raises(HashMismatch):
        bad.read()
    with pytest.raises(HashMismatch):
        bad.seek(0) or bad.read(1)
    assert not bad.verified
    empty, _ = _open(loop, b"")
    assert empty.read() == b""
    assert empty.verified


def test_limits_and_the_loop_thread_are_checked(loop: asyncio.AbstractEventLoop) -> None:
    for bad in (
        {"cache_bytes": 65 * 1024 * KIB},
        {"block_size": 1},
        {"block_size": True},
        {"read_ahead": -1},
    ):
        with pytest.raises(InvalidArgument):
            CacheLimits.create(**bad)  # type: ignore[arg-type]
    file, ranges = _open(loop, b"x" * 100_000)

    async def on_the_loop() -> None:
        file.read(1)

    with pytest.raises(FailedPrecondition, match="thread"):
        asyncio.run_coroutine_threadsafe(on_the_loop(), loop).result()
    assert ranges.calls == []
    assert file.read(3) == b"xxx"
