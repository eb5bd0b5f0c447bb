"""Restart-resumable uploads: a real SDK process killed with SIGKILL half-way."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lake_sdk
from lake_core import faults
from lake_objects import FileUpload, S3ObjectStore, UploadCheckpointMismatch
from lake_objects.checkpoint import CheckpointFile
from lake_sdk import LakeClient
from tests.files.conftest import INSERT, MIB, S3Lake, sdk_env, write_random
from tools.lake_testing.faults import reset_process_faults

pytestmark = [pytest.mark.s3, pytest.mark.asyncio, pytest.mark.slow]

PARTS = 12
CHILD = """
import asyncio, sys, time
from lake_sdk import FileUpload, LakeClient

async def main(url, path, checkpoints):
    def slow(progress):
        time.sleep(0.25)  # hold the loop: parts complete one by one, slowly
    async with await LakeClient.connect(
        url, upload_checkpoint_dir=checkpoints, upload_concurrency=1, progress=slow
    ) as client:
        await client.insert(
            "INSERT INTO robots.episodes (episode_id, video) VALUES (?, ?)",
            ["ep-resumed", FileUpload.from_path(path, "video/mp4")],
        )

asyncio.run(main(*sys.argv[1:4]))
"""


def _kill_half_way(lake: S3Lake, source: Path, checkpoints: Path) -> int:
    """Start the SDK in a child process, SIGKILL it once 4+ parts are checkpointed."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, lake.url, str(source), str(checkpoints)],
        env=sdk_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            files = list((checkpoints / "uploads").glob("*.json"))
            if files:
                try:
                    parts = len(_load(files[0]).parts)
                except Exception:
                    parts = 0
                if parts >= 4:
                    os.kill(child.pid, signal.SIGKILL)
                    child.wait(10)
                    return parts
            time.sleep(0.05)
        raise AssertionError("the child never checkpointed 4 parts")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def _load(path: Path):  # type: ignore[no-untyped-def]
    file = CheckpointFile.__new__(CheckpointFile)
    file.path = path
    return file.load()


async def test_sigkilled_upload_resumes_sending_only_missing_parts(
    s3_lake: S3Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = write_random(tmp_path / "episode.bin", PARTS * 5 * MIB - 1234)
    checkpoints = tmp_path / "checkpoints"
    _kill_half_way(s3_lake, source, checkpoints)
    [checkpoint_path] = list((checkpoints / "uploads").glob("*.json"))
    checkpoint = _load(checkpoint_path)
    durable = len(checkpoint.parts)
    assert 4 <= durable < PARTS
    [open_upload] = s3_lake.open_uploads()
    remote = s3_lake.client().list_parts(
        Bucket=s3_lake.bucket, Key=open_upload["Key"], UploadId=open_upload["UploadId"]
    )["Parts"]
    assert len(remote) >= durable  # S3 may hold a part finished after the last checkpoint

    # The new process uses today's default part size: the checkpoint's 5 MiB wins.
    monkeypatch.delenv(faults.FAULTS)
    reset_process_faults()
    async with await LakeClient.connect(s3_lake.url, upload_checkpoint_dir=checkpoints) as client:
        version = await client.insert(
            INSERT, ["ep-resumed", FileUpload.from_path(source, "video/mp4")]
        )
        store = await client.object_store()
        assert isinstance(store, S3ObjectStore)
        assert store.part_size == 64 * MIB
        # Only the parts after the durable checkpoint went again.
        assert store.requests["UploadPart"] == PARTS - durable
        assert store.requests["CreateMultipartUpload"] == 0
        table = await client.query_table("SELECT * FROM robots.episodes")
        assert table.num_rows == 1
        assert version == 1
        location = lake_sdk.data_location(table, "video", 0)
        assert location.uri.endswith(open_upload["Key"])
        assert location.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
        reader = await client.open(location)
        assert len(await reader.read()) == source.stat().st_size
        assert reader.verified
    assert s3_lake.open_uploads() == []
    assert list((checkpoints / "uploads").glob("*.json")) == []


async def test_changed_source_or_tampered_checkpoint_fails_closed(
    s3_lake: S3Lake, tmp_path: Path
) -> None:
    source = write_random(tmp_path / "episode.bin", PARTS * 5 * MIB)
    checkpoints = tmp_path / "checkpoints"
    _kill_half_way(s3_lake, source, checkpoints)
    [checkpoint_path] = list((checkpoints / "uploads").glob("*.json"))
    original = checkpoint_path.read_bytes()
    async with await LakeClient.connect(s3_lake.url, upload_checkpoint_dir=checkpoints) as client:
        store = await client.object_store()
        # An unknown recorded part size (validly re-signed) is refused.
        file = CheckpointFile(checkpoints, store.descriptor.uri, str(source))
        file.save(_load(checkpoint_path).model_copy(update={"part_size": 8 * MIB}))
        with pytest.raises(UploadCheckpointMismatch):
            await client.insert(INSERT, ["x", FileUpload.from_path(source, "video/mp4")])
        # A hand-edited checkpoint fails its integrity check.
        checkpoint_path.write_bytes(original.replace(b'"size": 5242880', b'"size": 5242881', 1))
        with pytest.raises(UploadCheckpointMismatch):
            await client.insert(INSERT, ["x", FileUpload.from_path(source, "video/mp4")])
        checkpoint_path.write_bytes(original)
        # The source changed since the checkpoint: fail closed, send nothing.
        with source.open("r+b") as out:
            out.write(b"changed")
        with pytest.raises(UploadCheckpointMismatch):
            await client.insert(INSERT, ["x", FileUpload.from_path(source, "video/mp4")])
        assert store.requests["UploadPart"] == 0
        # The abandoned upload can be cancelled explicitly.
        assert await client.cancel_upload(source)
    assert s3_lake.open_uploads() == []
    assert list((checkpoints / "uploads").glob("*.json")) == []
