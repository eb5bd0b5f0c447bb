"""Errors of the managed object stage, under Lake's ``LakeError`` root.

The classes live in :mod:`lake_core.errors` (every class a server can send
lives there, so one table rebuilds it on any client); this module names the
stage's part of the tree.

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
    CapabilityRejected,
    HashMismatch,
    InvalidRange,
    InvalidUpload,
    LocationOutsideStage,
    ObjectIntegrityError,
    ObjectNotFound,
    ObjectOverlong,
    ObjectStoreUnavailable,
    PrematureEof,
    PresignUnsupported,
    RangeMismatch,
    StageUnavailable,
    TooManyParts,
    UploadCheckpointMismatch,
    UploadInProgress,
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

#: Messages for people (no client decides anything from them).
NO_STAGE_MESSAGE = "this Query has no managed object stage"
NO_ISSUER_MESSAGE = "this Query issues read capabilities only for an S3 stage"
