"""Restart-resumable S3 uploads of files, driven by a checkpoint.

A fresh upload creates the multipart upload and writes the checkpoint before
the first part, then rewrites it each time the contiguous run of completed
parts grows. A retry (same stage, same source path) locks the checkpoint and:

1. validates it: version, integrity, a 5 MiB or 64 MiB part size, the same
   stage and bucket/key inside the tenant scope, and an unchanged source file
   (size, mtime, inode, device); any mismatch fails closed before S3 or
   source I/O beyond a ``stat``;
2. reconciles it with ListParts: the parts it records are trusted up to the
   first that S3 does not report with the same ETag and size; anything S3
   reports beyond that is untrusted and is uploaded again;
3. rehashes the recorded prefix of the file and compares it to the recorded
   SHA-256 (a changed file fails closed), keeping the hash state at the end
   of the trusted parts;
4. uploads only the remaining parts, completes, verifies the object's size,
   and only then deletes the checkpoint.

If the upload is gone (aborted, or completed just before a crash), a
checkpoint marked ``completing`` whose object exists with the right size is
a finished upload; anything else starts over with a new object.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any, Protocol

import structlog

from lake_core.models import DataLocation
from lake_objects.checkpoint import CheckpointFile, PartEntry, SourceRecord, UploadCheckpoint
from lake_objects.descriptor import StageDescriptor
from lake_objects.errors import ObjectStoreUnavailable, UploadCheckpointMismatch
from lake_objects.multipart import Part, PartReader, upload_parts
from lake_objects.progress import ProgressCallback, ProgressTracker
from lake_objects.scope import TenantScope
from lake_objects.source import FileUpload, SourceIdentity

__all__ = ["MultipartStore", "cancel_upload", "resumable_upload"]


class MultipartStore(Protocol):
    """What a resumable upload needs of its store (:class:`~lake_objects.S3ObjectStore`)."""

    descriptor: StageDescriptor
    scope: TenantScope
    bucket: str
    key_prefix: str
    part_size: int
    upload_concurrency: int
    max_parts: int
    stall_timeout_s: float | None

    def new_name(self) -> str: ...

    def key_of(self, name: str) -> str: ...

    async def client(self) -> Any: ...

    async def one_shot(
        self, upload: FileUpload, total: int | None, progress: ProgressCallback | None
    ) -> DataLocation: ...

    async def complete(
        self, client: Any, key: str, uri: str, upload_id: str, parts: list[Part]
    ) -> int: ...


log = structlog.get_logger("lake_objects.resume")
REHASH_CHUNK = 8 * 1024 * 1024


async def resumable_upload(
    store: MultipartStore,
    upload: FileUpload,
    checkpoint_dir: str | os.PathLike[str],
    progress: ProgressCallback | None,
) -> DataLocation:
    assert upload.path is not None
    file = CheckpointFile(checkpoint_dir, store.descriptor.uri, upload.path)
    await asyncio.to_thread(file.lock)
    finished = False
    try:
        identity = await asyncio.to_thread(SourceIdentity.of, upload.path)
        checkpoint = await asyncio.to_thread(file.load)
        if checkpoint is not None:
            _validate(store, checkpoint, identity, upload)
            location = await _resume(store, upload, file, checkpoint, progress)
            if location is not None:
                finished = True
                return location
            await asyncio.to_thread(file.delete)
        location = await _fresh(store, upload, file, identity, progress)
        finished = True
        return location
    finally:
        file.unlock(remove=finished)


def _validate(
    store: MultipartStore,
    checkpoint: UploadCheckpoint,
    identity: SourceIdentity,
    upload: FileUpload,
) -> None:
    if checkpoint.stage_uri != store.descriptor.uri or checkpoint.bucket != store.bucket:
        raise UploadCheckpointMismatch(
            f"the upload checkpoint of {upload.path!r} belongs to another stage; "
            "cancel the upload to start over"
        )
    prefix = store.key_prefix + "/"
    if not checkpoint.key.startswith(prefix):
        raise UploadCheckpointMismatch("the upload checkpoint names a key outside the tenant stage")
    store.scope.check(store.descriptor.uri + "/" + checkpoint.key[len(prefix) :])
    if checkpoint.source != SourceRecord.of(identity):
        raise UploadCheckpointMismatch(
            f"{upload.path!r} changed since its upload checkpoint was written; "
            "cancel the upload to start over"
        )
    if checkpoint.media_type != upload.media_type:
        raise UploadCheckpointMismatch(
            f"the upload checkpoint of {upload.path!r} has media type {checkpoint.media_type!r}"
        )
    for part in checkpoint.parts[:-1]:
        if part.size != checkpoint.part_size:
            raise UploadCheckpointMismatch("the upload checkpoint's part sizes are inconsistent")


async def _fresh(
    store: MultipartStore,
    upload: FileUpload,
    file: CheckpointFile,
    identity: SourceIdentity,
    progress: ProgressCallback | None,
) -> DataLocation:
    if identity.size < store.part_size:
        # One PutObject: nothing to resume.
        return await store.one_shot(upload, identity.size, progress)
    name = store.new_name()
    uri = store.scope.uri_for(name)
    key = store.key_of(name)
    client = await store.client()
    created = await client.create_multipart_upload(Bucket=store.bucket, Key=key)
    checkpoint = UploadCheckpoint(
        stage_uri=store.descriptor.uri,
        bucket=store.bucket,
        key=key,
        upload_id=created["UploadId"],
        media_type=upload.media_type,
        source=SourceRecord.of(identity),
        part_size=store.part_size,
        prefix_sha256=hashlib.sha256(b"").hexdigest(),
    )
    await asyncio.to_thread(file.save, checkpoint)
    tracker = ProgressTracker(upload.name, identity.size, progress)
    return await _run(store, upload, file, checkpoint, hashlib.sha256(), [], uri, tracker)


async def _resume(
    store: MultipartStore,
    upload: FileUpload,
    file: CheckpointFile,
    checkpoint: UploadCheckpoint,
    progress: ProgressCallback | None,
) -> DataLocation | None:
    from botocore.exceptions import ClientError

    client = await store.client()
    uri = store.descriptor.uri + "/" + checkpoint.key[len(store.key_prefix) + 1 :]
    try:
        remote = await _list_parts(client, store.bucket, checkpoint)
    except ClientError as exc:
        if _error_code(exc) != "NoSuchUpload":
            raise
        return await _finished_or_gone(store, client, checkpoint, uri, file)
    trusted = 0
    for part in checkpoint.parts:
        if remote.get(part.number) != (part.etag, part.size):
            break
        trusted = part.number
    hasher = await asyncio.to_thread(_rehash, upload.path or "", checkpoint, trusted)
    log.info(
        "resuming upload",
        key=checkpoint.key,
        recorded_parts=len(checkpoint.parts),
        trusted_parts=trusted,
        remote_parts=len(remote),
    )
    done = [Part(p.number, p.etag, p.size) for p in checkpoint.parts[:trusted]]
    if trusted < len(checkpoint.parts):
        checkpoint = _with_parts(checkpoint, done, hasher.hexdigest())
        await asyncio.to_thread(file.save, checkpoint)
    tracker = ProgressTracker(upload.name, checkpoint.source.size, progress)
    tracker.add(sum(p.size for p in done))
    return await _run(store, upload, file, checkpoint, hasher, done, uri, tracker)


async def _run(
    store: MultipartStore,
    upload: FileUpload,
    file: CheckpointFile,
    checkpoint: UploadCheckpoint,
    hasher: Any,
    done: list[Part],
    uri: str,
    tracker: ProgressTracker,
) -> DataLocation:
    client = await store.client()
    source = FileUpload.from_path(upload.path or "", upload.media_type).chunks(checkpoint.part_size)
    current = checkpoint

    async def durable(parts: list[Part], digest: str) -> None:
        nonlocal current
        current = _with_parts(current, parts, digest)
        await asyncio.to_thread(file.save, current)

    try:
        await source.skip(sum(p.size for p in done))
        parts = await upload_parts(
            client,
            bucket=store.bucket,
            key=checkpoint.key,
            upload_id=checkpoint.upload_id,
            reader=PartReader(source, hasher, digests=True),
            done=done,
            concurrency=store.upload_concurrency,
            max_parts=store.max_parts,
            uri=uri,
            on_durable=durable,
            on_part=tracker.add,
            stall_timeout_s=store.stall_timeout_s,
        )
    finally:
        source.close()
    size = sum(p.size for p in parts)
    after = await asyncio.to_thread(SourceIdentity.of, upload.path or "")
    if size != checkpoint.source.size or SourceRecord.of(after) != checkpoint.source:
        raise UploadCheckpointMismatch(
            f"{upload.path!r} changed during its upload; cancel the upload to start over"
        )
    sha256 = hasher.hexdigest()
    current = current.model_copy(update={"completing": True, "sha256": sha256})
    await asyncio.to_thread(file.save, current)
    await store.complete(client, checkpoint.key, uri, checkpoint.upload_id, parts)
    await asyncio.to_thread(file.delete)
    tracker.finish()
    return DataLocation(uri=uri, media_type=upload.media_type, size_bytes=size, sha256=sha256)


async def _list_parts(
    client: Any, bucket: str, checkpoint: UploadCheckpoint
) -> dict[int, tuple[str, int]]:
    remote: dict[int, tuple[str, int]] = {}
    marker = 0
    while True:
        reply = await client.list_parts(
            Bucket=bucket,
            Key=checkpoint.key,
            UploadId=checkpoint.upload_id,
            PartNumberMarker=marker,
            MaxParts=1000,
        )
        for item in reply.get("Parts", []):
            remote[int(item["PartNumber"])] = (str(item["ETag"]), int(item["Size"]))
        if not reply.get("IsTruncated"):
            return remote
        marker = int(reply["NextPartNumberMarker"])


async def _finished_or_gone(
    store: MultipartStore, client: Any, checkpoint: UploadCheckpoint, uri: str, file: CheckpointFile
) -> DataLocation | None:
    if checkpoint.completing and checkpoint.sha256:
        try:
            head = await client.head_object(Bucket=store.bucket, Key=checkpoint.key)
        except Exception:
            head = None
        if head is not None and int(head["ContentLength"]) == checkpoint.source.size:
            await asyncio.to_thread(file.delete)
            return DataLocation(
                uri=uri,
                media_type=checkpoint.media_type,
                size_bytes=checkpoint.source.size,
                sha256=checkpoint.sha256,
            )
    log.warning("checkpointed upload no longer exists; starting over", key=checkpoint.key)
    return None


def _rehash(path: str, checkpoint: UploadCheckpoint, trusted: int) -> Any:
    """Hash the recorded prefix; return the hash state after the trusted parts."""
    hasher = hashlib.sha256()
    kept: Any = hasher.copy() if trusted == 0 else None
    with open(path, "rb") as source:
        for part in checkpoint.parts:
            remaining = part.size
            while remaining:
                data = source.read(min(REHASH_CHUNK, remaining))
                if not data:
                    raise UploadCheckpointMismatch(f"{path!r} is shorter than its checkpoint says")
                hasher.update(data)
                remaining -= len(data)
            if part.number == trusted:
                kept = hasher.copy()
    if hasher.hexdigest() != checkpoint.prefix_sha256:
        raise UploadCheckpointMismatch(
            f"the bytes of {path!r} differ from those already uploaded; "
            "cancel the upload to start over"
        )
    return kept


def _error_code(exc: BaseException) -> str:
    """S3's error code of a botocore ClientError (its structured reply, not its message)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def _with_parts(checkpoint: UploadCheckpoint, parts: list[Part], digest: str) -> UploadCheckpoint:
    return checkpoint.model_copy(
        update={
            "parts": [PartEntry(number=p.number, etag=p.etag, size=p.size) for p in parts],
            "prefix_sha256": digest,
        }
    )


async def cancel_upload(
    store: MultipartStore, path: str, checkpoint_dir: str | os.PathLike[str]
) -> bool:
    """Abort the checkpointed upload of ``path`` and delete its checkpoint."""
    file = CheckpointFile(checkpoint_dir, store.descriptor.uri, path)
    await asyncio.to_thread(file.lock)
    try:
        try:
            checkpoint = await asyncio.to_thread(file.load)
        except UploadCheckpointMismatch:
            await asyncio.to_thread(file.delete)
            return True
        if checkpoint is None:
            return False
        if checkpoint.bucket == store.bucket and checkpoint.key.startswith(store.key_prefix + "/"):
            client = await store.client()
            try:
                await client.abort_multipart_upload(
                    Bucket=store.bucket, Key=checkpoint.key, UploadId=checkpoint.upload_id
                )
            except Exception as exc:
                if _error_code(exc) != "NoSuchUpload":
                    raise ObjectStoreUnavailable(
                        f"aborting the upload of {path!r} failed: {type(exc).__name__}"
                    ) from None
        await asyncio.to_thread(file.delete)
        return True
    finally:
        file.unlock(remove=True)
