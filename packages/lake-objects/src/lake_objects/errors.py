"""Errors of the managed object stage, under Lake's ``LakeError`` root.

    LakeError
    ├── InvalidArgument
    │   ├── InvalidRange                 empty, reversed or out-of-bounds range
    │   ├── InvalidUpload                bad media type, unreadable source, bad options
    │   └── TooManyParts                 an upload would need more than 10,000 parts
    ├── PermissionDenied
    │   ├── LocationOutsideStage         a DataLocation outside the tenant's child prefix
    │   └── CapabilityRejected           storage refused a capability (expired, tampered), or redirected
    ├── FailedPrecondition
    │   ├── StageUnavailable             no stage (query-only client, none configured)
    │   ├── PresignUnsupported           the stage cannot mint read capabilities
    │   ├── UploadCheckpointMismatch     source or stage changed since the checkpoint
    │   └── UploadInProgress             another process holds the checkpoint lock
    ├── NotFound
    │   └── ObjectNotFound
    ├── Unavailable
    │   └── ObjectStoreUnavailable       storage did not answer (retryable)
    └── Internal
        └── ObjectIntegrityError         the bytes are not the ones the DataLocation names
            ├── PrematureEof
            ├── ObjectOverlong
            ├── HashMismatch
            └── RangeMismatch            a ranged response that is not exactly the range

Messages name the object (its URI) or the option concerned, never a
credential, a presigned URL or a header value.
"""

from __future__ import annotations

from lake_core.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)

__all__ = [
    "CapabilityRejected",
    "HashMismatch",
    "InvalidRange",
    "InvalidUpload",
    "LocationOutsideStage",
    "ObjectIntegrityError",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectStoreUnavailable",
    "PrematureEof",
    "PresignUnsupported",
    "RangeMismatch",
    "StageUnavailable",
    "TooManyParts",
    "UploadCheckpointMismatch",
    "UploadInProgress",
]


#: Stable message starts, so a client can re-type these errors after gRPC.
NO_STAGE_MESSAGE = "this Query has no managed object stage"
NO_ISSUER_MESSAGE = "this Query issues read capabilities only for an S3 stage"


class InvalidRange(InvalidArgument):
    """A byte range that is empty, reversed or outside the object."""


class InvalidUpload(InvalidArgument):
    """An upload that cannot start: bad media type, source or option."""


class TooManyParts(InvalidArgument):
    """An upload that would need more multipart parts than S3 allows (10,000)."""


class LocationOutsideStage(PermissionDenied):
    """A DataLocation whose URI is not inside the caller's tenant child prefix."""


class CapabilityRejected(PermissionDenied):
    """Object storage refused a read capability (expired or tampered), or redirected it."""


class StageUnavailable(FailedPrecondition):
    """No managed stage to use: a query-only client, or a Query without one."""


class PresignUnsupported(FailedPrecondition):
    """The stage cannot mint read capabilities (local stages)."""


class UploadCheckpointMismatch(FailedPrecondition):
    """An upload checkpoint that no longer matches its source file or stage."""


class UploadInProgress(FailedPrecondition):
    """Another process holds the lock of this upload checkpoint."""


class ObjectNotFound(NotFound):
    """The object a DataLocation names does not exist."""


class ObjectStoreUnavailable(Unavailable):
    """Object storage did not answer; the operation may be retried."""


class ObjectIntegrityError(Internal):
    """The bytes read are not the ones the DataLocation describes."""

    def __init__(self, message: str, *, uri: str) -> None:
        super().__init__(message)
        self.uri = uri


class PrematureEof(ObjectIntegrityError):
    """The object (or range) ended before its declared size."""


class ObjectOverlong(ObjectIntegrityError):
    """The object is longer than its declared size."""


class HashMismatch(ObjectIntegrityError):
    """The object has its declared size but not its declared SHA-256."""


class RangeMismatch(ObjectIntegrityError):
    """A ranged response whose status, Content-Range or length is not exactly the range."""
