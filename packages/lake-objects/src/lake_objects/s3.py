"""The S3 stage, through aioboto3 with this process's own AWS credentials.

Uploads: objects smaller than one part are a single PutObject; larger ones
are multipart (:mod:`lake_objects.multipart`), 64 MiB parts, 4 in flight by
default (1..=16). A one-shot upload aborts its multipart upload on any
failure or cancellation (bounded, best effort). A path-backed upload with a
checkpoint directory is restart-resumable (:mod:`lake_objects.resume`).

Reads: one GetObject per reader; a range is one Range GET whose status,
Content-Range and length must be exactly the range before a byte is yielded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from lake_core import faults
from lake_core.errors import LakeError, PermissionDenied
from lake_core.ids import new_operation_id
from lake_core.models import DataLocation
from lake_objects._body import PartBody
from lake_objects.capability import ReadCapability, check_content_range, check_whole_length
from lake_objects.descriptor import StageDescriptor
from lake_objects.errors import (
    InvalidUpload,
    ObjectNotFound,
    ObjectStoreUnavailable,
    PrematureEof,
    RangeMismatch,
    TooManyParts,
)
from lake_objects.multipart import MAX_PARTS, Part, PartReader, upload_parts
from lake_objects.progress import ProgressCallback, ProgressTracker
from lake_objects.reader import CHUNK_SIZE, ObjectReader
from lake_objects.resume import cancel_upload, resumable_upload
from lake_objects.source import FileUpload
from lake_objects.store import ManagedObjectStore, capability_ttl

__all__ = [
    "DEFAULT_PART_SIZE",
    "DEFAULT_UPLOAD_CONCURRENCY",
    "S3ObjectStore",
    "presign_get",
    "s3_client",
    "storage_error",
]

log = structlog.get_logger("lake_objects.s3")

MIB = 1024 * 1024
DEFAULT_PART_SIZE = 64 * MIB
#: The part size of version-1 checkpoints; new uploads use it only under test hooks.
LEGACY_PART_SIZE = 5 * MIB
DEFAULT_UPLOAD_CONCURRENCY = 4
MAX_UPLOAD_CONCURRENCY = 16
ABORT_TIMEOUT_S = 10.0
#: Tries of one request when the client bounds stalls (``stall_timeout_s``): a retry
#: more than a stall needs, since the same client sends upload parts, which S3's
#: throttling (503 SlowDown) under a fleet's load can refuse twice in a row.
STALL_ATTEMPTS = 3
OBJECTS_DIR = "objects"


def storage_error(exc: BaseException, uri: str) -> LakeError:
    """The Lake error for a botocore/aiohttp failure; never includes credentials."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            return ObjectNotFound(f"object {uri!r} does not exist")
        if code in ("AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId") or status == 403:
            return PermissionDenied(f"object storage refused access to {uri!r} ({code or status})")
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "InternalError"):
            return ObjectStoreUnavailable(f"object storage failed for {uri!r} ({code or status})")
        return ObjectStoreUnavailable(f"object storage rejected a request for {uri!r} ({code})")
    return ObjectStoreUnavailable(f"object storage unreachable for {uri!r}: {type(exc).__name__}")


def _status(exc: BaseException) -> int:
    """The HTTP status of a botocore ClientError (0 for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_storage_failure(exc: BaseException) -> bool:
    import aiohttp
    from botocore.exceptions import BotoCoreError, ClientError

    return isinstance(
        exc, BotoCoreError | ClientError | aiohttp.ClientError | TimeoutError | ConnectionError
    )


def _send_bodies_at_once(client: Any) -> None:
    """Send request bodies without asking ``Expect: 100-continue`` first.

    aiohttp waits for the ``100 Continue`` with no timeout at all, so a store
    that never answered an upload's headers hung it before the body's stall
    bound (:class:`~lake_objects._body.PartBody`) could start.
    """
    from botocore.handlers import add_expect_header

    client.meta.events.unregister("before-call.s3", add_expect_header)


def s3_client(
    endpoint_url: str | None, region: str, pool: int = 12, *, stall_timeout_s: float | None = None
) -> Any:
    """An aiobotocore S3 client context manager using the default credential chain.

    ``stall_timeout_s`` bounds how long S3 may stay silent: it is botocore's
    read timeout, the longest wait for the next bytes (a response, or more of
    a body), never the length of a transfer, so a slow but moving multi-GB
    read is not cut. (That timer starts only once a request's body was sent:
    :class:`S3ObjectStore` bounds the sending of its upload bodies itself.)
    With it a request is tried :data:`STALL_ATTEMPTS` times, so a stall
    surfaces within about ``STALL_ATTEMPTS * stall_timeout_s``.
    Without it, 120 s and five tries (what the server processes use).
    """
    import aioboto3
    from aiobotocore.config import AioConfig

    if stall_timeout_s is None:
        bounds: dict[str, Any] = {
            "retries": {"max_attempts": 4, "mode": "standard"},
            "connect_timeout": 30,
            "read_timeout": 120,
        }
    else:
        bounds = {
            "retries": {"total_max_attempts": STALL_ATTEMPTS, "mode": "standard"},
            "connect_timeout": min(30.0, stall_timeout_s),
            "read_timeout": stall_timeout_s,
        }

    config = AioConfig(
        region_name=region,
        # botocore's default CRC32 on every request costs ~18% of upload throughput.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        max_pool_connections=pool,
        signature_version="s3v4",
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        **bounds,
    )
    return aioboto3.Session().client("s3", endpoint_url=endpoint_url, config=config)


async def presign_get(client: Any, bucket: str, key: str, ttl_secs: int) -> ReadCapability:
    """Sign a GET of one object; no request is sent."""
    expires = datetime.now(UTC) + timedelta(seconds=ttl_secs)
    url: str = await client.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=ttl_secs
    )
    return ReadCapability(url, {}, expires)


class _BodyChunks:
    """Chunks of one GetObject body."""

    def __init__(self, body: Any, uri: str) -> None:
        self._body = body
        self._uri = uri

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        try:
            data: bytes = await self._body.read(CHUNK_SIZE)
        except Exception as exc:
            if type(exc).__name__ in ("ClientPayloadError", "ResponseStreamingError"):
                raise PrematureEof(
                    f"the response for {self._uri!r} ended before its declared length",
                    uri=self._uri,
                ) from None
            if _is_storage_failure(exc):
                raise storage_error(exc, self._uri) from None
            raise
        if not data:
            raise StopAsyncIteration
        return data

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()


class S3ObjectStore(ManagedObjectStore):
    """A tenant's child prefix in an S3 bucket.

    ``requests`` counts the S3 API calls this store made, by operation name
    (useful to prove that something made none).
    """

    def __init__(
        self,
        descriptor: StageDescriptor,
        *,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
        part_size: int | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        if descriptor.kind != "s3":
            raise ValueError("S3ObjectStore needs an s3 stage descriptor")
        if (
            isinstance(upload_concurrency, bool)
            or not isinstance(upload_concurrency, int)
            or not 1 <= upload_concurrency <= MAX_UPLOAD_CONCURRENCY
        ):
            raise InvalidUpload(
                f"upload_concurrency must be in 1..={MAX_UPLOAD_CONCURRENCY}, got {upload_concurrency!r}"
            )
        # Tests only (LAKE_FAULTS=objects.upload_part_size=5242880): tests move few bytes.
        test_size = faults.setting(faults.UPLOAD_PART_SIZE)
        if part_size is None:
            part_size = test_size or DEFAULT_PART_SIZE
        if part_size != DEFAULT_PART_SIZE and part_size != test_size:
            raise InvalidUpload(f"part_size must be {DEFAULT_PART_SIZE // MIB} MiB")
        super().__init__(descriptor)
        self.bucket = descriptor.bucket
        self.key_prefix = descriptor.key_prefix
        self.upload_concurrency = upload_concurrency
        # How long S3 may stay silent before a request fails (see s3_client), also
        # while it is sent an upload's body (PartBody).
        self.stall_timeout_s = stall_timeout_s
        self.part_size = part_size
        self.max_parts = MAX_PARTS
        self.endpoint_url = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or descriptor.endpoint_url
        )
        self.region = (
            region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or descriptor.region
            or "us-east-1"
        )
        self.requests: Counter[str] = Counter()
        self._client: Any = None
        self._client_cm: Any = None
        self._client_lock = asyncio.Lock()

    # -- client ------------------------------------------------------------------

    async def client(self) -> Any:
        """The aiobotocore S3 client (created on first use, closed by :meth:`close`)."""
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                cm = s3_client(
                    self.endpoint_url,
                    self.region,
                    self.upload_concurrency + 8,
                    stall_timeout_s=self.stall_timeout_s,
                )
                client = await cm.__aenter__()
                client.meta.events.register("before-call.s3", self._count)
                if self.stall_timeout_s is not None:
                    _send_bodies_at_once(client)
                self._client_cm = cm
                self._client = client
        return self._client

    def _count(self, model: Any = None, **_: Any) -> None:
        self.requests[getattr(model, "name", "?")] += 1

    async def close(self) -> None:
        if self._client_cm is not None:
            cm, self._client_cm, self._client = self._client_cm, None, None
            await cm.__aexit__(None, None, None)

    def key_of(self, name: str) -> str:
        return f"{self.key_prefix}/{name}"

    # -- uploads -----------------------------------------------------------------

    async def upload(
        self,
        upload: FileUpload,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> DataLocation:
        total = upload.validate()
        if total is not None and total > self.part_size * self.max_parts:
            raise TooManyParts(
                f"{upload.name!r} ({total} bytes) needs more than {self.max_parts:,} parts "
                f"of {self.part_size // MIB} MiB"
            )
        try:
            if checkpoint_dir is not None and upload.path is not None:
                return await resumable_upload(self, upload, checkpoint_dir, progress)
            return await self.one_shot(upload, total, progress)
        except Exception as exc:
            if _is_storage_failure(exc):
                raise storage_error(exc, self.descriptor.uri) from None
            raise

    def new_name(self) -> str:
        return f"{OBJECTS_DIR}/{new_operation_id()}"

    async def one_shot(
        self, upload: FileUpload, total: int | None, progress: ProgressCallback | None
    ) -> DataLocation:
        """Upload without a checkpoint: one PutObject, or a multipart upload aborted on failure."""
        name = self.new_name()
        uri = self.scope.uri_for(name)
        key = self.key_of(name)
        client = await self.client()
        hasher = hashlib.sha256()
        source = upload.chunks(self.part_size)
        reader = PartReader(source, hasher, digests=False)
        tracker = ProgressTracker(upload.name, total, progress)
        try:
            # A list, handed on and popped: no frame keeps the first part alive.
            first = [await reader.next()]
            if len(first[0][0]) < self.part_size:
                data = first.pop()[0]
                size = len(data)
                upload.check_unchanged(size)
                await self.put_small(client, key, uri, data)
                tracker.add(size)
            else:
                size = await self._multipart(client, key, uri, reader, first, tracker)
                # Completed, but never referenced if it is refused: GC reclaims it.
                upload.check_unchanged(size)
        finally:
            source.close()
        tracker.finish()
        return DataLocation(
            uri=uri, media_type=upload.media_type, size_bytes=size, sha256=hasher.hexdigest()
        )

    async def put_small(self, client: Any, key: str, uri: str, data: bytes) -> None:
        try:
            await client.put_object(
                Bucket=self.bucket, Key=key, Body=PartBody(data, self.stall_timeout_s)
            )
        except Exception as exc:
            if _is_storage_failure(exc):
                raise storage_error(exc, uri) from None
            raise

    async def _multipart(
        self,
        client: Any,
        key: str,
        uri: str,
        reader: PartReader,
        first: list[tuple[bytes, str]],
        tracker: ProgressTracker,
    ) -> int:
        try:
            created = await client.create_multipart_upload(Bucket=self.bucket, Key=key)
        except Exception as exc:
            if _is_storage_failure(exc):
                raise storage_error(exc, uri) from None
            raise
        upload_id = created["UploadId"]
        try:
            parts = await upload_parts(
                client,
                bucket=self.bucket,
                key=key,
                upload_id=upload_id,
                reader=reader,
                done=[],
                concurrency=self.upload_concurrency,
                max_parts=self.max_parts,
                uri=uri,
                first=first,
                on_part=tracker.add,
                stall_timeout_s=self.stall_timeout_s,
            )
            return await self.complete(client, key, uri, upload_id, parts)
        except BaseException as exc:
            await self.abort(client, key, upload_id)
            if isinstance(exc, Exception) and _is_storage_failure(exc):
                raise storage_error(exc, uri) from None
            raise

    async def complete(
        self, client: Any, key: str, uri: str, upload_id: str, parts: list[Part]
    ) -> int:
        """Complete the upload and verify the object's size; return it."""
        size = sum(p.size for p in parts)
        await client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": p.etag} for p in parts]},
        )
        head = await client.head_object(Bucket=self.bucket, Key=key)
        if int(head["ContentLength"]) != size:
            raise ObjectStoreUnavailable(
                f"completed object {uri!r} has {head['ContentLength']} bytes, expected {size}"
            )
        return size

    async def abort(self, client: Any, key: str, upload_id: str) -> None:
        """Abort a multipart upload: bounded, best effort, survives our own cancellation."""
        try:
            await asyncio.wait_for(
                asyncio.shield(
                    client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
                ),
                ABORT_TIMEOUT_S,
            )
        except BaseException as exc:
            log.warning("multipart abort failed", key=key, error=type(exc).__name__)

    async def cancel_upload(
        self, path: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str]
    ) -> bool:
        return await cancel_upload(self, os.path.abspath(path), checkpoint_dir)  # noqa: ASYNC240

    # -- reads -------------------------------------------------------------------

    async def _get(self, location: DataLocation, name: str, **extra: Any) -> dict[str, Any]:
        client = await self.client()
        try:
            response: dict[str, Any] = await client.get_object(
                Bucket=self.bucket, Key=self.key_of(name), **extra
            )
            return response
        except Exception as exc:
            if "Range" in extra and _status(exc) == 416:
                # The range was checked against the declared size: the object is shorter.
                raise RangeMismatch(
                    f"{extra['Range']} of {location.uri!r}: storage answered 416, the object "
                    f"is shorter than its declared {location.size_bytes} bytes",
                    uri=location.uri,
                ) from None
            if _is_storage_failure(exc):
                raise storage_error(exc, location.uri) from None
            raise

    async def _open(self, location: DataLocation, name: str) -> ObjectReader:
        response = await self._get(location, name)
        body = response["Body"]
        try:
            check_whole_length(location, response.get("ContentLength"))
        except BaseException:
            body.close()
            raise
        return ObjectReader(location, _BodyChunks(body, location.uri))

    async def _open_range(
        self, location: DataLocation, name: str, start: int, end: int
    ) -> ObjectReader:
        response = await self._get(location, name, Range=f"bytes={start}-{end - 1}")
        body = response["Body"]
        try:
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status != 206:
                raise RangeMismatch(
                    f"range {start}..{end} of {location.uri!r}: storage answered {status}, not 206",
                    uri=location.uri,
                )
            check_content_range(
                location, start, end, response.get("ContentRange"), response.get("ContentLength")
            )
        except BaseException:
            body.close()
            raise
        return ObjectReader(location, _BodyChunks(body, location.uri), start=start, end=end)

    async def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        name = self.check(location)
        seconds = capability_ttl(ttl)
        return await presign_get(await self.client(), self.bucket, self.key_of(name), seconds)

    async def list_open_uploads(self) -> list[dict[str, Any]]:
        """Multipart uploads still open under this tenant's prefix."""
        client = await self.client()
        reply = await client.list_multipart_uploads(
            Bucket=self.bucket, Prefix=self.key_prefix + "/"
        )
        uploads: list[dict[str, Any]] = reply.get("Uploads", [])
        return uploads
