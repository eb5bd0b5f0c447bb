"""Every error a Lake client can raise, under one ``LakeError`` root.

Catch the class you mean; each knows its gRPC status and whether retrying the
same call may succeed (``error.retryable``). Servers send the exact class
name with every error, so a ``TableNotFound`` raised in Query or Metasrv is a
``TableNotFound`` here (not a bare ``NotFound``)::

    LakeError
    ├── InvalidArgument            INVALID_ARGUMENT
    │   ├── InvalidName
    │   ├── InvalidSchema
    │   ├── SchemaMismatch
    │   ├── InvalidAppend
    │   ├── SqlError
    │   │   └── IntegerOverflow          integer arithmetic or a sum left its type's range
    │   ├── ReadOnlySql
    │   ├── InvalidFlightData            a DoPut stream that is not well-formed Arrow IPC
    │   ├── InvalidRange                 empty, reversed or out-of-bounds byte range
    │   ├── InvalidUpload                bad media type, unreadable source, bad options
    │   └── TooManyParts                 an upload would need more than 10,000 parts
    ├── ConfigError                (startup only)
    ├── NotFound                   NOT_FOUND
    │   ├── TableNotFound
    │   └── ObjectNotFound
    ├── AlreadyExists              ALREADY_EXISTS
    │   └── TableExists
    ├── FailedPrecondition         FAILED_PRECONDITION
    │   ├── VersionReclaimed
    │   ├── OperationExpired
    │   ├── StageUnavailable             no stage (query-only client, none configured)
    │   ├── PresignUnsupported           the stage cannot mint read capabilities
    │   ├── UploadCheckpointMismatch     source or stage changed since the checkpoint
    │   └── UploadInProgress             another process holds the checkpoint lock
    ├── Aborted                    ABORTED (refresh, then retry)
    │   └── StaleReadVersion
    ├── Unauthenticated            UNAUTHENTICATED
    ├── PermissionDenied           PERMISSION_DENIED
    │   ├── LocationOutsideStage         a DataLocation outside the tenant's child prefix
    │   └── CapabilityRejected           storage refused a capability, or redirected
    ├── ResourceExhausted          RESOURCE_EXHAUSTED (retryable)
    │   ├── PayloadTooLarge              over a byte cap (not retryable unchanged)
    │   ├── ResultTooLarge               an async result over its byte ceiling
    │   └── QueryTooLarge                over a memory or output bound (not retryable)
    ├── DeadlineExceeded           DEADLINE_EXCEEDED
    ├── QueryCancelled             CANCELLED (a durable job cancelled by CancelFlightInfo)
    ├── Unavailable                UNAVAILABLE (retryable)
    │   ├── NotLeader                    this Metasrv may not write now
    │   └── ObjectStoreUnavailable       object storage did not answer
    ├── CommitStateUnknown         UNKNOWN (retry with the same operation id)
    ├── Unimplemented              UNIMPLEMENTED
    ├── DataCorrupted              DATA_LOSS (a stored file is not what was written)
    └── Internal                   INTERNAL
        └── ObjectIntegrityError         the bytes are not the ones the DataLocation names
            ├── PrematureEof
            ├── ObjectOverlong
            ├── HashMismatch
            └── RangeMismatch            a ranged response that is not exactly the range

The SDK adds ``MissingExtra`` (a FailedPrecondition and an ``ImportError``:
``to_pandas``/``to_polars`` without their extra) and two for durable appends
(``upload_checkpoint_dir``):
``PendingAppendDamaged`` (a FailedPrecondition: a pending-append file that is
truncated or altered) and ``PendingAppendUncertain`` (the pending append was
written but its directory could not be synced: resume it, do not insert again).
"""

from lake_core.errors import (
    Aborted,
    AlreadyExists,
    CapabilityRejected,
    CommitStateUnknown,
    ConfigError,
    DataCorrupted,
    DeadlineExceeded,
    FailedPrecondition,
    HashMismatch,
    IntegerOverflow,
    Internal,
    InvalidAppend,
    InvalidArgument,
    InvalidFlightData,
    InvalidName,
    InvalidRange,
    InvalidSchema,
    InvalidUpload,
    LakeError,
    LocationOutsideStage,
    NotFound,
    NotLeader,
    ObjectIntegrityError,
    ObjectNotFound,
    ObjectOverlong,
    ObjectStoreUnavailable,
    OperationExpired,
    PayloadTooLarge,
    PermissionDenied,
    PrematureEof,
    PresignUnsupported,
    QueryCancelled,
    QueryTooLarge,
    RangeMismatch,
    ReadOnlySql,
    ResourceExhausted,
    ResultTooLarge,
    SchemaMismatch,
    SqlError,
    StageUnavailable,
    StaleReadVersion,
    TableExists,
    TableNotFound,
    TooManyParts,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    UploadCheckpointMismatch,
    UploadInProgress,
    VersionReclaimed,
)
from lake_sdk._pending import PendingAppendDamaged, PendingAppendUncertain

__all__ = [
    "Aborted",
    "AlreadyExists",
    "CapabilityRejected",
    "CommitStateUnknown",
    "ConfigError",
    "DataCorrupted",
    "DeadlineExceeded",
    "FailedPrecondition",
    "HashMismatch",
    "IntegerOverflow",
    "Internal",
    "InvalidAppend",
    "InvalidArgument",
    "InvalidFlightData",
    "InvalidName",
    "InvalidRange",
    "InvalidSchema",
    "InvalidUpload",
    "LakeError",
    "LocationOutsideStage",
    "MissingExtra",
    "NotFound",
    "NotLeader",
    "ObjectIntegrityError",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectStoreUnavailable",
    "OperationExpired",
    "PayloadTooLarge",
    "PendingAppendDamaged",
    "PendingAppendUncertain",
    "PermissionDenied",
    "PrematureEof",
    "PresignUnsupported",
    "QueryCancelled",
    "QueryTooLarge",
    "RangeMismatch",
    "ReadOnlySql",
    "ResourceExhausted",
    "ResultTooLarge",
    "SchemaMismatch",
    "SqlError",
    "StageUnavailable",
    "StaleReadVersion",
    "TableExists",
    "TableNotFound",
    "TooManyParts",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "UploadCheckpointMismatch",
    "UploadInProgress",
    "VersionReclaimed",
]


class MissingExtra(FailedPrecondition, ImportError):
    """An optional library (pandas, polars) is not installed; the message names the extra.

    Also an ``ImportError``, so code that already guards an optional import catches it.
    """


# InvalidRecording and InvalidDataset belong to the optional robot-data modules
# (lake_sdk.mcap, lake_sdk.lerobot): importable from here, outside the frozen
# top-level surface that __all__ lists.


class InvalidRecording(InvalidArgument):
    """A file given as an MCAP recording is not one: wrong magic, truncated or corrupt.

    Raised before anything is uploaded or appended.
    """


class InvalidDataset(InvalidArgument):
    """A directory given as a LeRobot dataset is not a readable v3.0 dataset."""
