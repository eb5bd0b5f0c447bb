"""Lake's error tree.

Every error knows the gRPC status it travels as and whether a caller may retry
it unchanged. Messages name the table, config key or object concerned, never a
secret.

    LakeError
    ├── InvalidArgument            INVALID_ARGUMENT
    │   ├── InvalidName
    │   ├── InvalidSchema
    │   ├── SchemaMismatch
    │   ├── InvalidAppend
    │   ├── SqlError
    │   └── ReadOnlySql
    ├── ConfigError                (startup only)
    ├── NotFound                   NOT_FOUND
    │   └── TableNotFound
    ├── AlreadyExists              ALREADY_EXISTS
    │   └── TableExists
    ├── FailedPrecondition         FAILED_PRECONDITION
    │   ├── VersionReclaimed
    │   └── OperationExpired
    ├── Aborted                    ABORTED (refresh, then retry)
    │   └── StaleReadVersion
    ├── Unauthenticated            UNAUTHENTICATED
    ├── PermissionDenied           PERMISSION_DENIED
    ├── ResourceExhausted          RESOURCE_EXHAUSTED
    ├── DeadlineExceeded           DEADLINE_EXCEEDED
    ├── Unavailable                UNAVAILABLE (retryable)
    ├── CommitStateUnknown         UNKNOWN (retry with the same operation id)
    ├── Unimplemented              UNIMPLEMENTED
    ├── Internal                   INTERNAL
    └── DataCorrupted              DATA_LOSS
"""

from __future__ import annotations

import grpc

__all__ = [
    "Aborted",
    "AlreadyExists",
    "CommitStateUnknown",
    "ConfigError",
    "DataCorrupted",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidAppend",
    "InvalidArgument",
    "InvalidName",
    "InvalidSchema",
    "LakeError",
    "NotFound",
    "OperationExpired",
    "PermissionDenied",
    "ReadOnlySql",
    "ResourceExhausted",
    "SchemaMismatch",
    "SqlError",
    "StaleReadVersion",
    "TableExists",
    "TableNotFound",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "VersionReclaimed",
    "error_for_status",
]


class LakeError(Exception):
    """Root of every error Lake raises on purpose."""

    grpc_status: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable: bool = False


class InvalidArgument(LakeError):
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class InvalidName(InvalidArgument):
    """A namespace or table name that Lake does not accept."""


class InvalidSchema(InvalidArgument):
    """A table schema that Lake cannot store."""


class SchemaMismatch(InvalidArgument):
    """Appended data whose schema is not exactly the table's."""


class InvalidAppend(InvalidArgument):
    """An append outside Lake's bounds (rows, bytes, empty batches, ids)."""


class SqlError(InvalidArgument):
    """SQL that DataFusion could not parse or plan."""


READ_ONLY_MESSAGE = "Lake SQL is read-only: use the SDK's append API to write data"


class ReadOnlySql(InvalidArgument):
    """DDL, DML or a statement sent to Lake's read-only SQL surface."""

    def __init__(self, message: str = READ_ONLY_MESSAGE) -> None:
        super().__init__(message)


class ConfigError(LakeError):
    """Invalid process configuration; raised before any listener binds."""

    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(LakeError):
    grpc_status = grpc.StatusCode.NOT_FOUND


class TableNotFound(NotFound):
    def __init__(self, table: object) -> None:
        super().__init__(f"table not found: {table}")
        self.table = table


class AlreadyExists(LakeError):
    grpc_status = grpc.StatusCode.ALREADY_EXISTS


class TableExists(AlreadyExists):
    def __init__(self, table: object) -> None:
        super().__init__(f"table already exists: {table}")
        self.table = table


class FailedPrecondition(LakeError):
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class VersionReclaimed(FailedPrecondition):
    """A pinned table version that retention has since removed."""


class OperationExpired(FailedPrecondition):
    """An append operation id older than the server's retention horizon."""


class Aborted(LakeError):
    grpc_status = grpc.StatusCode.ABORTED
    retryable = True


class StaleReadVersion(Aborted):
    """A write based on a version that is no longer current."""


class Unauthenticated(LakeError):
    grpc_status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(LakeError):
    grpc_status = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(LakeError):
    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True


class DeadlineExceeded(LakeError):
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(LakeError):
    grpc_status = grpc.StatusCode.UNAVAILABLE
    retryable = True


class CommitStateUnknown(LakeError):
    """The commit may or may not have happened: retry with the same operation id."""

    grpc_status = grpc.StatusCode.UNKNOWN
    retryable = True


class Unimplemented(LakeError):
    grpc_status = grpc.StatusCode.UNIMPLEMENTED


class Internal(LakeError):
    grpc_status = grpc.StatusCode.INTERNAL


class DataCorrupted(LakeError):
    """A table data file is corrupt or unreadable (names table and version only)."""

    grpc_status = grpc.StatusCode.DATA_LOSS


_BY_STATUS: dict[grpc.StatusCode, type[LakeError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNKNOWN: CommitStateUnknown,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.DATA_LOSS: DataCorrupted,
}


def error_for_status(status: grpc.StatusCode, message: str) -> LakeError:
    """The Lake error a client raises for a gRPC status received from a server."""
    return _BY_STATUS.get(status, Internal)(message)
