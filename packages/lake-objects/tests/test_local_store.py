"""The local store, readers and upload checkpoints, on a temporary directory."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lake_core.errors import FailedPrecondition
from lake_core.models import DataLocation
from lake_objects import (
    FileUpload,
    HashMismatch,
    InvalidRange,
    InvalidUpload,
    LocationOutsideStage,
    ObjectNotFound,
    ObjectOverlong,
    PrematureEof,
    PresignUnsupported,
    StageSettings,
    UploadCheckpointMismatch,
    UploadInProgress,
    open_store,
)
from lake_objects.checkpoint import CheckpointFile, SourceRecord, UploadCheckpoint
from lake_objects.store import ManagedObjectStore


def _store(tmp_path: Path) -> ManagedObjectStore:
    return open_store(StageSettings.local(tmp_path / "objects").descriptor("acme"))


@pytest.mark.asyncio
async def test_upload_and_verified_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    data = os.urandom(9 * 1024 * 1024 + 3)
    source = tmp_path / "src.bin"
    source.write_bytes(data)
    seen: list[int] = []
    location = await store.upload(
        FileUpload.from_path(source, "video/mp4"), progress=lambda p: seen.append(p.done)
    )
    assert location.sha256 == hashlib.sha256(data).hexdigest()
    assert location.size_bytes == len(data) == seen[-1]
    reader = await store.open(location)
    assert await reader.read() == data
    assert reader.verified
    assert await (await store.open_range(location, 5, 4_000_001)).read() == data[5:4_000_001]
    for start, end in [(1, 1), (2, 1), (0, len(data) + 1)]:
        with pytest.raises(InvalidRange):
            await store.open_range(location, start, end)
    with pytest.raises(PresignUnsupported):
        await store.presign_read(location, 60)
    # No hidden temporary file is left behind.
    assert [p.name for p in (tmp_path / "objects" / "tenants" / "acme" / "objects").iterdir()] == [
        location.uri.rsplit("/", 1)[1]
    ]


@pytest.mark.asyncio
async def test_empty_and_reader_uploads(tmp_path: Path) -> None:
    store = _store(tmp_path)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    empty = await store.upload(FileUpload.from_reader(io.BytesIO(b""), "text/plain"))
    assert (empty.size_bytes, empty.sha256) == (0, hashlib.sha256(b"").hexdigest())
    upload = FileUpload.from_reader(chunks(), "text/plain")
    streamed = await store.upload(upload)
    assert await (await store.open(streamed)).read() == b"abcd"
    with pytest.raises(InvalidUpload):
        await store.upload(upload)  # one-shot


@pytest.mark.asyncio
async def test_integrity_errors(tmp_path: Path) -> None:
    store = _store(tmp_path)
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 1000)
    location = await store.upload(FileUpload.from_path(source, "video/mp4"))
    path = Path(location.uri.removeprefix("file://"))
    for body, error in (
        (b"x" * 999 + b"y", HashMismatch),
        (b"x" * 999, PrematureEof),
        (b"x" * 1001, ObjectOverlong),
    ):
        path.write_bytes(body)  # noqa: ASYNC240
        reader = await store.open(location)
        with pytest.raises(error):
            await reader.read()
    path.write_bytes(b"x" * 10)  # noqa: ASYNC240
    with pytest.raises(PrematureEof):
        await (await store.open_range(location, 5, 20)).read()
    missing = DataLocation(uri=location.uri + "0", media_type="a/b", size_bytes=1, sha256="0" * 64)
    with pytest.raises(ObjectNotFound):
        await store.open(missing)
    # The stage's own objects folder, named as an object: not found, not IsADirectoryError.
    folder = missing.model_copy(update={"uri": location.uri.rsplit("/", 1)[0]})
    for read in (
        lambda: store.open(folder),
        lambda: store.open_range(folder, 0, 1),
        lambda: store.map_range(folder, 0, 1),
    ):
        with pytest.raises(ObjectNotFound):
            await read()


@pytest.mark.asyncio
async def test_copy_to_a_path_renames_only_verified_bytes(tmp_path: Path) -> None:
    store = _store(tmp_path)
    source = tmp_path / "src.bin"
    source.write_bytes(b"x" * 1000)
    location = await store.upload(FileUpload.from_path(source, "video/mp4"))
    stored = Path(location.uri.removeprefix("file://"))
    out = tmp_path / "out"
    out.mkdir()
    copy = out / "copy.mp4"
    assert await (await store.open(location)).copy_to(copy) == 1000
    assert copy.read_bytes() == b"x" * 1000
    assert copy.stat().st_mode & 0o777 == 0o666 & ~_umask()
    for body, error in ((b"x" * 999 + b"y", HashMismatch), (b"x" * 600, PrematureEof)):
        stored.write_bytes(body)  # noqa: ASYNC240
        fresh = out / "fresh.mp4"
        with pytest.raises(error):
            await (await store.open(location)).copy_to(fresh)
        assert not fresh.exists()
        with pytest.raises(error):
            await (await store.open(location)).copy_to(copy)
        assert copy.read_bytes() == b"x" * 1000  # the old copy is intact
        assert sorted(p.name for p in out.iterdir()) == ["copy.mp4"]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_media_types_and_sources_are_checked(tmp_path: Path) -> None:
    for bad in ("", "video", "video/mp4; codecs=x", "x" * 300):
        with pytest.raises(InvalidUpload):
            FileUpload.from_path(tmp_path, bad)
    with pytest.raises(InvalidUpload):
        FileUpload.from_path(tmp_path, "video/mp4").validate()  # a directory
    with pytest.raises(InvalidUpload):
        FileUpload.from_reader("not a reader", "video/mp4")  # type: ignore[arg-type]


def _checkpoint(part_size: int) -> UploadCheckpoint:
    return UploadCheckpoint(
        stage_uri="s3://b/p/tenants/t",
        bucket="b",
        key="p/tenants/t/objects/x",
        upload_id="u",
        media_type="video/mp4",
        source=SourceRecord(path="/x", size=1, mtime_ns=1, inode=1, device=1),
        part_size=part_size,
        prefix_sha256="0" * 64,
    )


def test_checkpoints_are_versioned_checked_and_locked(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path, "s3://b/p/tenants/t", "/x")
    assert file.load() is None
    for size in (5 * 1024 * 1024, 64 * 1024 * 1024):
        file.save(_checkpoint(size))
        loaded = file.load()
        assert loaded is not None
        assert loaded.part_size == size
    with pytest.raises(ValueError, match="part_size"):
        _checkpoint(8 * 1024 * 1024)
    raw = file.path.read_bytes()
    assert b"secret" not in raw.lower()
    assert b"aws_" not in raw.lower()
    file.path.write_bytes(raw.replace(b'"upload_id": "u"', b'"upload_id": "v"'))
    with pytest.raises(UploadCheckpointMismatch):
        file.load()
    file.path.write_bytes(b"{" * (5 * 1024 * 1024))
    with pytest.raises(UploadCheckpointMismatch):
        file.load()
    file.lock()
    other = CheckpointFile(tmp_path, "s3://b/p/tenants/t", "/x")
    with pytest.raises(UploadInProgress, match="another process"):
        other.lock()
    file.unlock()
    other.lock()
    other.unlock(remove=True)


@pytest.mark.parametrize("change", ["truncate", "grow", "rewrite"])
@pytest.mark.asyncio
async def test_a_file_changed_while_uploading_is_not_stored(tmp_path: Path, change: str) -> None:
    """Its torn bytes were stored as a complete object, which then verified on every read."""
    store = _store(tmp_path)
    source = tmp_path / "src.bin"
    source.write_bytes(os.urandom(16 * 1024 * 1024))

    def meddle(progress: Any) -> None:
        if progress.done == 4 * 1024 * 1024:  # after the first chunk
            if change == "truncate":
                os.truncate(source, 1024 * 1024)
            elif change == "grow":
                with open(source, "ab") as out:
                    out.write(b"more")
            else:
                with open(source, "r+b") as out:
                    out.seek(8 * 1024 * 1024)
                    out.write(b"\0" * 4096)
                os.utime(source, ns=(1, 1))

    with pytest.raises(InvalidUpload, match="changed while it was uploaded"):
        await store.upload(FileUpload.from_path(source, "video/mp4"), progress=meddle)
    assert list((tmp_path / "objects" / "tenants" / "acme" / "objects").iterdir()) == []


@pytest.mark.asyncio
async def test_an_upload_whose_partial_file_gc_removed_fails_typed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    objects = tmp_path / "objects" / "tenants" / "acme" / "objects"

    async def slow_chunks() -> AsyncIterator[bytes]:
        yield b"first"
        # What lake gc does to a partial file past its safety age: it unlinks it.
        for partial in objects.glob(".*.partial"):
            partial.unlink()
        yield b"second"

    with pytest.raises(FailedPrecondition, match="upload it again") as caught:
        await store.upload(FileUpload.from_reader(slow_chunks(), "text/plain", name="clip.bin"))
    assert "clip.bin" in str(caught.value)
    assert str(tmp_path) not in str(caught.value)
    assert caught.value.__cause__ is None
    assert list(objects.iterdir()) == []


@pytest.mark.asyncio
async def test_mapped_ranges_are_the_read_ranges_checked_the_same_way(tmp_path: Path) -> None:
    store = _store(tmp_path)
    data = os.urandom(5 * 1024 * 1024 + 7)
    source = tmp_path / "src.bin"
    source.write_bytes(data)
    location = await store.upload(FileUpload.from_path(source, "video/mp4"))
    # Unaligned and aligned starts, the last byte, one byte, the whole object.
    for start, end in [
        (0, len(data)),
        (1, 2),
        (4095, 4097),
        (4096, 1_000_000),
        (len(data) - 1, len(data)),
    ]:
        view = await store.map_range(location, start, end)
        assert view is not None
        assert view.readonly
        assert (
            bytes(view)
            == data[start:end]
            == await (await store.open_range(location, start, end)).read()
        )
    for start, end in [(1, 1), (2, 1), (0, len(data) + 1)]:
        with pytest.raises(InvalidRange):
            await store.map_range(location, start, end)
    foreign = location.model_copy(update={"uri": location.uri.replace("/acme/", "/globex/")})
    with pytest.raises(LocationOutsideStage):
        await store.map_range(foreign, 0, 1)
    missing = location.model_copy(update={"uri": location.uri + "0"})
    with pytest.raises(ObjectNotFound):
        await store.map_range(missing, 0, 1)
    path = Path(location.uri.removeprefix("file://"))
    for body, error in ((data[:-1], PrematureEof), (data + b"y", ObjectOverlong)):
        path.write_bytes(body)  # noqa: ASYNC240
        with pytest.raises(error):
            await store.map_range(location, 0, 1)
