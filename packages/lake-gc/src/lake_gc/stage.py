"""The managed stage as GC sees it: a paginated inventory, and deletion.

Only the managed area (``<root or prefix>/tenants/``) is ever listed, and
only ``tenants/<tenant>/objects/<name>`` entries (what uploads write) are
ever candidates or deleted. :class:`LocalStage` walks the directory tree one directory at a
time (``os.scandir`` streams, nothing is collected); :class:`S3Stage` pages
through ``ListObjectsV2`` and ``ListMultipartUploads``. Both yield
:class:`Entry` values and delete :class:`Entry` values, where an already
absent object (or an already finished upload) counts as a success.

Kinds: ``object`` (a complete object), ``partial`` (a local upload's hidden
``.<id>.partial`` file, left by a killed uploader), ``upload`` (an open S3
multipart upload).
"""

from __future__ import annotations

import abc
import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lake_core.durable import fsync_dir
from lake_core.errors import FailedPrecondition, LakeError, Unavailable

__all__ = ["Entry", "Kind", "LocalStage", "ManagedStage", "Outcome", "S3Stage"]

Kind = Literal["object", "partial", "upload"]
TENANTS = "tenants"
#: Below ``tenants/``: a tenant id (lake_objects.scope), ``objects``, one object name.
_MANAGED_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}/objects/(?!\.\.?$)[^/]+")
#: S3 DeleteObjects takes at most this many keys per request.
S3_DELETE_BATCH = 1000


@dataclass(frozen=True)
class Entry:
    """One inventory entry: an object, a partial file or an open multipart upload."""

    uri: str
    size: int
    modified_ms: int
    kind: Kind = "object"
    upload_id: str = ""

    def line(self) -> str:
        """The sortable line form (``uri`` first; fields tab-separated)."""
        return f"{self.uri}\t{self.size}\t{self.modified_ms}\t{self.kind}\t{self.upload_id}"

    @classmethod
    def from_line(cls, line: str) -> Entry:
        uri, size, modified, kind, upload_id = line.split("\t")
        if kind not in ("object", "partial", "upload"):
            raise ValueError(f"unknown entry kind {kind[:20]!r}")
        return cls(uri, int(size), int(modified), kind, upload_id)  # type: ignore[arg-type]


@dataclass
class Outcome:
    deleted: int = 0
    absent: int = 0


def has_control_chars(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


class ManagedStage(abc.ABC):
    """The managed-object stage of one deployment (blocking calls)."""

    #: ``file:///root`` or ``s3://bucket/prefix``: what a plan binds.
    base_uri: str

    @property
    def managed_uri(self) -> str:
        return f"{self.base_uri}/{TENANTS}/"

    def owns(self, uri: str) -> bool:
        """Whether ``uri`` is a managed object's: ``tenants/<tenant>/objects/<name>``.

        Only the shape uploads write is ever a candidate, so nothing else
        that shares the prefix (a table of a namespace called ``tenants``,
        say: ``<table>.lance`` is no tenant id) can be planned or deleted.
        """
        if not uri.startswith(self.managed_uri) or has_control_chars(uri):
            return False
        return _MANAGED_NAME.fullmatch(uri[len(self.managed_uri) :]) is not None

    @abc.abstractmethod
    def entries(self) -> Iterator[Entry]:
        """Every entry under the managed area, page by page."""

    @abc.abstractmethod
    def delete(self, entries: Sequence[Entry]) -> Outcome:
        """Delete (or abort) ``entries``; durable on return; absent ones are successes."""


class LocalStage(ManagedStage):
    """A local stage directory (``LAKE_MANAGED_OBJECT_ROOT`` or ``<data-dir>/objects``)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"
        self.base_uri = "file://" + self.root.rstrip("/")

    def entries(self) -> Iterator[Entry]:
        top = os.path.join(self.root, TENANTS)
        # (directory, depth below tenants/): only tenants/<tenant>/objects/ holds
        # names GC may own, so nothing deeper is walked (foreign trees are left alone).
        pending = [(top, 0)] if os.path.isdir(top) else []
        while pending:
            directory, depth = pending.pop()
            try:
                scan = os.scandir(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _unlistable(exc, directory, self.base_uri) from None
            with scan:
                for item in scan:
                    try:
                        info = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while we looked
                    if stat.S_ISDIR(info.st_mode):
                        if depth < 2:
                            pending.append((item.path, depth + 1))
                    elif stat.S_ISREG(info.st_mode):
                        partial = item.name.startswith(".") and item.name.endswith(".partial")
                        yield Entry(
                            uri="file://" + item.path,
                            size=info.st_size,
                            modified_ms=info.st_mtime_ns // 1_000_000,
                            kind="partial" if partial else "object",
                        )
                    # Symlinks and special files are never managed objects: left alone.

    def path_of(self, entry: Entry) -> str:
        if not self.owns(entry.uri) or entry.kind == "upload":
            raise FailedPrecondition(f"plan entry {entry.uri[:200]!r} is not in the local stage")
        return entry.uri[len("file://") :]

    def delete(self, entries: Sequence[Entry]) -> Outcome:
        outcome = Outcome()
        directories: set[str] = set()
        for entry in entries:
            path = self.path_of(entry)
            try:
                os.unlink(path)
            except FileNotFoundError:
                outcome.absent += 1
                continue
            outcome.deleted += 1
            directories.add(os.path.dirname(path))
        for directory in directories:
            fsync_dir(directory)  # the page is done only once its removals are durable
        return outcome


def _unlistable(exc: OSError, directory: str, stage: str) -> LakeError:
    """The stage's fault (its permissions, a disk error), never the plan's or the caller's."""
    what = f"GC cannot list {directory} in the stage {stage}: {exc.strerror}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return FailedPrecondition(what)
    return Unavailable(f"{what}; retry")


class S3Stage(ManagedStage):
    """An S3 stage (``LAKE_S3_BUCKET`` + ``LAKE_MANAGED_OBJECT_PREFIX``), listed by pages."""

    def __init__(self, bucket: str, prefix: str, client: Any, *, page_size: int = 1000) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.base_uri = f"s3://{bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self._client = client
        self._page_size = page_size

    @property
    def _list_prefix(self) -> str:
        return (f"{self.prefix}/" if self.prefix else "") + f"{TENANTS}/"

    def entries(self) -> Iterator[Entry]:
        yield from self.objects()
        yield from self.uploads()

    def objects(self) -> Iterator[Entry]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=self._list_prefix,
            PaginationConfig={"PageSize": self._page_size},
        )
        for page in guarded(pages, self.base_uri):
            for item in page.get("Contents", []):
                yield Entry(
                    uri=f"s3://{self.bucket}/{item['Key']}",
                    size=int(item["Size"]),
                    modified_ms=int(item["LastModified"].timestamp() * 1000),
                )

    def uploads(self) -> Iterator[Entry]:
        paginator = self._client.get_paginator("list_multipart_uploads")
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=self._list_prefix,
            PaginationConfig={"PageSize": self._page_size},
        )
        for page in guarded(pages, self.base_uri):
            for upload in page.get("Uploads", []):
                yield Entry(
                    uri=f"s3://{self.bucket}/{upload['Key']}",
                    size=0,
                    modified_ms=int(upload["Initiated"].timestamp() * 1000),
                    kind="upload",
                    upload_id=str(upload["UploadId"]),
                )

    def key_of(self, entry: Entry) -> str:
        if not self.owns(entry.uri) or entry.kind == "partial":
            raise FailedPrecondition(f"plan entry {entry.uri[:200]!r} is not in the S3 stage")
        return entry.uri[len(f"s3://{self.bucket}/") :]

    def delete(self, entries: Sequence[Entry]) -> Outcome:
        from botocore.exceptions import ClientError

        outcome = Outcome()
        keys = [self.key_of(e) for e in entries if e.kind == "object"]
        for start in range(0, len(keys), S3_DELETE_BATCH):
            batch = keys[start : start + S3_DELETE_BATCH]
            try:
                reply = self._client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except Exception as exc:
                raise s3_error(exc, self.base_uri) from None
            errors = [e for e in reply.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                raise Unavailable(
                    f"S3 refused {len(errors)} deletions in {self.base_uri} "
                    f"(first: {errors[0].get('Code')}); apply again to resume"
                )
            # S3 does not say which keys existed: a deletion of an absent key succeeds.
            outcome.deleted += len(batch)
        for entry in entries:
            if entry.kind != "upload":
                continue
            try:
                self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.key_of(entry), UploadId=entry.upload_id
                )
                outcome.deleted += 1
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("NoSuchUpload", "404"):
                    raise s3_error(exc, self.base_uri) from None
                outcome.absent += 1
            except Exception as exc:
                raise s3_error(exc, self.base_uri) from None
        return outcome


def guarded(pages: Iterator[Any], where: str) -> Iterator[Any]:
    try:
        yield from pages
    except Exception as exc:
        raise s3_error(exc, where) from None


def s3_error(exc: BaseException, where: str) -> Exception:
    """Typed by the exception and its error code, never by message text."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchBucket", "AccessDenied"):
            return FailedPrecondition(f"S3 refused GC access to {where}: {code}")
        return Unavailable(f"S3 failed for {where} ({code}); retry")
    if isinstance(exc, BotoCoreError | OSError):
        return Unavailable(f"S3 is unreachable for {where}; retry")
    return exc if isinstance(exc, Exception) else Unavailable(str(exc))
