"""open_file on local and S3 stages: random access, the cache bound, verification, archives."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import tarfile
import zipfile
from pathlib import Path

import pytest

import lake_sdk
from lake_sdk import FailedPrecondition, HashMismatch, InvalidArgument, PresignUnsupported
from tests.files.conftest import MIB, write_random
from tests.training.open_file_support import (
    Stage,
    random_access,
    store_file,
)

STAGES = [pytest.param("local"), pytest.param("s3", marks=pytest.mark.s3)]

SIZE = 6 * MIB + 12_345  # not a whole number of blocks


@pytest.fixture(params=STAGES)
def stage(request: pytest.FixtureRequest) -> Stage:
    found: Stage = request.getfixturevalue(f"{request.param}_stage")
    return found


@pytest.fixture
def stored(stage: Stage, tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    path = write_random(tmp_path / "object.bin", SIZE, seed=7)
    with lake_sdk.Client(stage.url) as client:
        location = store_file(client, path, request.node.name)
        yield client, location, path.read_bytes(), stage


def test_random_seeks_and_reads_equal_the_object(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data, _ = stored
    # A small cache, so that blocks are evicted and fetched again all the time.
    limits = {"block_size": 256 * 1024, "cache_bytes": 2 * MIB, "read_ahead": 512 * 1024}
    with client.open_file(location, **limits) as file:
        assert isinstance(file, io.BufferedIOBase)
        assert file.readable()
        assert file.seekable()
        assert not file.writable()
        random_access(file, data, 1000, seed=1)
        assert 0 < file.peak_cached_bytes <= 2 * MIB
        assert file.bytes_fetched > SIZE  # re-fetches after eviction are counted


def test_bytes_fetched_stay_within_the_cache_when_the_object_fits(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data, _ = stored
    with client.open_file(location) as file:  # defaults: 1 MiB blocks, 32 MiB cache
        assert file.limits.cache_bytes == 32 * MIB
        random_access(file, data, 1000, seed=2)
        # Nothing was evicted, so no block was fetched twice.
        assert file.bytes_fetched <= SIZE
        assert file.peak_cached_bytes <= SIZE
    with client.open_file(location) as file:
        file.seek(3 * MIB + 5)
        assert file.read(10) == data[3 * MIB + 5 : 3 * MIB + 15]
        assert file.bytes_fetched == MIB  # one block, no read-ahead after a seek
        assert file.fetches == 1


def test_sequential_read_to_eof_verifies_and_reads_ahead(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data, _ = stored
    with client.open_file(location) as file:
        got = bytearray()
        while chunk := file.read(32 * 1024):
            got += chunk
        assert bytes(got) == data
        assert file.verified
        assert file.bytes_fetched == SIZE
        assert file.fetches < SIZE // MIB  # read-ahead fetched several blocks at once
    with client.open_file(location) as file:  # jumping about, but covering it in order
        file.seek(SIZE - 10)
        assert file.read() == data[-10:]
        file.seek(0)
        assert hashlib.sha256(file.read()).hexdigest() == location.sha256
        assert file.verified


def test_a_tampered_object_fails_a_full_sequential_read(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data, stage = stored
    flipped = bytearray(data)
    flipped[SIZE - 100] ^= 0x01  # same size, one bit, in the last block
    stage.overwrite(location, bytes(flipped))
    with client.open_file(location) as file:
        assert file.read(MIB) == data[:MIB]  # a prefix proves nothing yet

        def drain() -> None:
            while file.read(256 * 1024):
                pass

        with pytest.raises(HashMismatch):
            drain()
        assert not file.verified
        file.seek(0)
        with pytest.raises(HashMismatch):  # known bad: every later read says so
            file.read(1)
    with client.open_file(location) as file, pytest.raises(HashMismatch):
        file.read()
    stage.overwrite(location, data + b"\0")  # longer than declared: no range of it is exact
    with client.open_file(location) as file, pytest.raises(lake_sdk.ObjectIntegrityError):
        file.read(1)


def test_zipfile_and_tarfile_read_members_through_open_file(stage: Stage, tmp_path: Path) -> None:
    rng = random.Random(3)
    members = {f"m{i}.bin": rng.randbytes(rng.randint(0, 300_000)) for i in range(12)}
    members["big.bin"] = rng.randbytes(5 * MIB)  # stored, so a small member need not read it
    zipped = tmp_path / "members.zip"
    with zipfile.ZipFile(zipped, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, body in members.items():
            archive.writestr(name, body)
    tarred = tmp_path / "members.tar"
    with tarfile.open(tarred, "w") as archive:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    with lake_sdk.Client(stage.url) as client:
        zip_location = store_file(client, zipped, f"zip-{stage.kind}")
        tar_location = store_file(client, tarred, f"tar-{stage.kind}")
        with client.open_file(zip_location) as file, zipfile.ZipFile(file) as archive:
            assert archive.read("m11.bin") == members["m11.bin"]
            assert file.bytes_fetched < zip_location.size_bytes / 2
            assert sorted(archive.namelist()) == sorted(members)
            for name, body in members.items():
                assert archive.read(name) == body
        with (
            client.open_file(tar_location) as file,
            tarfile.open(fileobj=file, mode="r:") as archive,
        ):
            for info in archive.getmembers():
                extracted = archive.extractfile(info)
                assert extracted is not None
                assert extracted.read() == members[info.name]


def test_async_client_file_is_used_off_the_loop(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, data, _ = stored

    async def main() -> None:
        async with lake_sdk.AsyncClient(client.url) as inner:
            file = await inner.open_file(location, block_size=256 * 1024, cache_bytes=MIB)
            with pytest.raises(FailedPrecondition, match="thread"):
                file.read(1)  # on the loop it would wait on itself
            file.seek(4 * MIB)
            assert await asyncio.to_thread(file.read, 1000) == data[4 * MIB : 4 * MIB + 1000]
            await asyncio.to_thread(file.close)
        with pytest.raises(ValueError, match="closed"):
            file.read(1)

    asyncio.run(main())


def test_options_and_misuse_fail_typed(stored) -> None:  # type: ignore[no-untyped-def]
    client, location, _, stage = stored
    for options in (
        {"cache_bytes": 65 * MIB},
        {"block_size": 1000},
        {"block_size": MIB, "cache_bytes": MIB},
        {"read_ahead": 20 * MIB},
        {"ttl": 0},
    ):
        with pytest.raises(InvalidArgument):
            client.open_file(location, **options)
    file = client.open_file(location)
    with pytest.raises(ValueError, match="negative"):
        file.seek(-1)
    file.seek(SIZE + 100)
    assert file.read(10) == b""
    file.close()
    with pytest.raises(ValueError, match="closed"):
        file.seek(0)
    if stage.kind == "local":  # it issues no capabilities: a query-only client cannot read it
        with (
            lake_sdk.Client(stage.url, query_only=True) as reader,
            pytest.raises(PresignUnsupported),
        ):
            reader.open_file(location)
    # A file outlives nothing: after its client closed it says so, typed.
    other = lake_sdk.Client(stage.url).__enter__()
    file = other.open_file(location)
    other.close()
    with pytest.raises(FailedPrecondition, match="closed"):
        file.read(1)
    file.close()
