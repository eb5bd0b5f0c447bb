"""Upload checkpoints: what a restarted process needs to finish a multipart upload.

One JSON file per (stage, source path) under ``<checkpoint-dir>/uploads/``,
rewritten atomically (temporary file, fsync, rename, directory fsync) each
time the contiguous run of completed parts grows. It holds no credentials:
the stage URI, bucket, key and upload id, the source file's identity, the
part size, the completed parts with their ETags, and the SHA-256 of the
completed prefix (so a resume can prove the local bytes did not change).
The file carries a SHA-256 of its own body and is at most 4 MiB; anything
else fails closed. A sibling ``.lock`` file (``flock``) keeps two processes
from driving one upload.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lake_core.durable import fsync_dir, replace_synced
from lake_objects.errors import UploadCheckpointMismatch, UploadInProgress
from lake_objects.source import SourceIdentity

__all__ = [
    "ACCEPTED_PART_SIZES",
    "CheckpointFile",
    "PartEntry",
    "SourceRecord",
    "UploadCheckpoint",
]

MIB = 1024 * 1024
#: Part sizes a checkpoint may record: today's 64 MiB and the earlier 5 MiB.
ACCEPTED_PART_SIZES = frozenset({5 * MIB, 64 * MIB})
MAX_CHECKPOINT_BYTES = 4 * MIB
UPLOADS_DIR = "uploads"


class PartEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int = Field(ge=1, le=10_000)
    etag: str = Field(min_length=1, max_length=256)
    size: int = Field(ge=1)


class SourceRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int = Field(ge=0)
    mtime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, identity: SourceIdentity) -> SourceRecord:
        return cls(
            path=identity.path,
            size=identity.size,
            mtime_ns=identity.mtime_ns,
            inode=identity.inode,
            device=identity.device,
        )


class UploadCheckpoint(BaseModel):
    """Version 1 of the checkpoint of one path-backed S3 multipart upload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["lake.upload_checkpoint"] = "lake.upload_checkpoint"
    stage_uri: str
    bucket: str
    key: str
    upload_id: str = Field(min_length=1, max_length=1024)
    media_type: str
    source: SourceRecord
    part_size: int
    parts: list[PartEntry] = Field(default_factory=list)
    prefix_sha256: str
    completing: bool = False
    sha256: str | None = None

    @field_validator("part_size")
    @classmethod
    def _part_size(cls, value: int) -> int:
        if value not in ACCEPTED_PART_SIZES:
            raise ValueError("part_size must be 5 MiB or 64 MiB")
        return value

    @field_validator("parts")
    @classmethod
    def _contiguous(cls, parts: list[PartEntry]) -> list[PartEntry]:
        if [p.number for p in parts] != list(range(1, len(parts) + 1)):
            raise ValueError("parts must be contiguous from 1")
        return parts

    @property
    def completed_bytes(self) -> int:
        return sum(p.size for p in self.parts)


class CheckpointFile:
    """The checkpoint and lock files of one source path in one stage."""

    def __init__(self, directory: str | os.PathLike[str], stage_uri: str, source_path: str) -> None:
        ident = hashlib.sha256(f"{stage_uri}\0{source_path}".encode()).hexdigest()[:40]
        self.directory = Path(directory) / UPLOADS_DIR
        self.path = self.directory / f"{ident}.json"
        self.lock_path = self.directory / f"{ident}.lock"
        self._lock_fd: int | None = None

    def __repr__(self) -> str:
        return f"CheckpointFile({str(self.path)!r})"

    def lock(self) -> None:
        """Take the checkpoint's lock, or raise UploadInProgress."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UploadInProgress(
                f"another process is uploading with checkpoint {self.path.name}"
            ) from None
        self._lock_fd = fd

    def unlock(self, *, remove: bool = False) -> None:
        if self._lock_fd is None:
            return
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.lock_path)
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = None

    def load(self) -> UploadCheckpoint | None:
        """The checkpoint, None if there is none; UploadCheckpointMismatch if it is damaged."""
        try:
            with open(self.path, "rb") as file:
                raw = file.read(MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            return None
        if len(raw) > MAX_CHECKPOINT_BYTES:
            raise UploadCheckpointMismatch(f"upload checkpoint {self.path.name} is too large")
        try:
            envelope = json.loads(raw)
            body = envelope["checkpoint"]
            digest = envelope["sha256"]
            if hashlib.sha256(_canonical(body)).hexdigest() != digest:
                raise ValueError("checksum")
            return UploadCheckpoint.model_validate(body)
        except (ValueError, KeyError, TypeError, ValidationError):
            raise UploadCheckpointMismatch(
                f"upload checkpoint {self.path.name} is damaged or of an unknown version; "
                "cancel the upload to start over"
            ) from None

    def save(self, checkpoint: UploadCheckpoint) -> None:
        body = checkpoint.model_dump(mode="json")
        data = json.dumps(
            {"checkpoint": body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}
        ).encode()
        self.directory.mkdir(parents=True, exist_ok=True)
        replace_synced(self.path, [data])

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        fsync_dir(self.directory)


def _canonical(body: object) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
