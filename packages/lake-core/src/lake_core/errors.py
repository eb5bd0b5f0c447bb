"""Lake's error tree, and how an error's class travels across the wire.

Every error knows the gRPC status it travels as and whether a caller may retry
it unchanged. Messages name the table, config key or object concerned, never a
secret. Every class that a Lake server can send lives in this module, so that
one table (:data:`WIRE_CLASSES`) derived from the tree rebuilds it on the
client side.

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
    │   └── QueryTooLarge                past a memory or output bound (not retryable unchanged)
    ├── DeadlineExceeded           DEADLINE_EXCEEDED
    ├── QueryCancelled             CANCELLED (an async query cancelled by CancelFlightInfo)
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

On the wire a server sends the gRPC status (what ADBC and pyarrow users see),
the message (for people), and, to Lake's own clients (which send the
``lake-error-codes: 1`` request header), two trailing metadata entries:
``lake-error-code`` (the exact class name) and ``lake-retryable``
(``true``/``false``). :func:`error_from_wire` turns them back into the class.
No code decides an error's class or retryability from its message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final

import grpc

__all__ = [
    "CODES_HEADER",
    "ERROR_CODE_KEY",
    "RETRYABLE_KEY",
    "WANTS_CODES",
    "WIRE_CLASSES",
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
    "NotFound",
    "NotLeader",
    "ObjectIntegrityError",
    "ObjectNotFound",
    "ObjectOverlong",
    "ObjectStoreUnavailable",
    "OperationExpired",
    "PayloadTooLarge",
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
    "error_from_wire",
    "is_failure",
    "wire_code",
    "wire_trailers",
]

#: Trailing metadata key naming the exact Lake error class of a failed call.
ERROR_CODE_KEY: Final = "lake-error-code"
#: Trailing metadata key saying whether the caller may retry the call unchanged.
RETRYABLE_KEY: Final = "lake-retryable"
#: Request header by which a Lake client asks for the two trailers above.
#: Clients that do not send it (ADBC, pyarrow, grpcurl) get the bare status:
#: ADBC reports any error that carries metadata with ``vendor_code=None`` (the
#: ADBC 1.1 "private data" sentinel), which would hide the gRPC status from them.
CODES_HEADER: Final = "lake-error-codes"
#: The request metadata pair every Lake client sends.
WANTS_CODES: Final = (CODES_HEADER, "1")


class LakeError(Exception):
    """Root of every error Lake raises on purpose."""

    grpc_status: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL
    retryable: bool = False

    @property
    def code(self) -> str:
        """The stable wire code of this error: its class name."""
        return type(self).__name__

    @classmethod
    def from_wire(cls, message: str, *, retryable: bool) -> LakeError:
        """This class rebuilt on the client from a server's message.

        Bypasses subclass constructors (``TableNotFound(table)``...): the
        server already formatted the message.
        """
        error = cls.__new__(cls)
        Exception.__init__(error, message)
        error.retryable = retryable
        return error


class InvalidArgument(LakeError):
    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class InvalidName(InvalidArgument):
    """A namespace or table name that Lake does not accept."""


class InvalidSchema(InvalidArgument):
    """A table schema that Lake cannot store."""


class SchemaMismatch(InvalidArgument):
    """Appended data whose schema is not exactly the table's."""


class InvalidAppend(InvalidArgument):
    """An append outside Lake's bounds (rows, bytes, empty batches, ids, values)."""


class SqlError(InvalidArgument):
    """SQL that DataFusion could not parse or plan."""


class IntegerOverflow(SqlError):
    """Integer arithmetic (``+ - *``, negation, ``/``) or a ``sum`` left its type's range.

    Lake refuses the query, as PostgreSQL and DuckDB do, rather than return
    a wrapped value. The message names the operation and the type.
    """


READ_ONLY_MESSAGE = "Lake SQL is read-only: use the SDK's append API to write data"


class ReadOnlySql(InvalidArgument):
    """DDL, DML or a statement sent to Lake's read-only SQL surface."""

    def __init__(self, message: str = READ_ONLY_MESSAGE) -> None:
        super().__init__(message)


class InvalidRange(InvalidArgument):
    """A byte range that is empty, reversed or outside the object."""


class InvalidUpload(InvalidArgument):
    """An upload that cannot start: bad media type, source or option."""


class TooManyParts(InvalidArgument):
    """An upload that would need more multipart parts than S3 allows (10,000)."""


class InvalidFlightData(InvalidArgument):
    """A FlightData stream that is not a well-formed Arrow IPC stream."""


class ConfigError(LakeError):
    """Invalid process configuration; raised before any listener binds."""

    grpc_status = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(LakeError):
    grpc_status = grpc.StatusCode.NOT_FOUND


class TableNotFound(NotFound):
    #: The table the caller named (None when rebuilt from the wire).
    table: object = None

    def __init__(self, table: object) -> None:
        super().__init__(f"table not found: {table}")
        self.table = table


class ObjectNotFound(NotFound):
    """The object a DataLocation names does not exist."""


class AlreadyExists(LakeError):
    grpc_status = grpc.StatusCode.ALREADY_EXISTS


class TableExists(AlreadyExists):
    #: The table the caller named (None when rebuilt from the wire).
    table: object = None

    def __init__(self, table: object) -> None:
        super().__init__(f"table already exists: {table}")
        self.table = table


class FailedPrecondition(LakeError):
    grpc_status = grpc.StatusCode.FAILED_PRECONDITION


class VersionReclaimed(FailedPrecondition):
    """A pinned table version that retention has since removed."""


class OperationExpired(FailedPrecondition):
    """An append operation id older than the server's retention horizon."""


class StageUnavailable(FailedPrecondition):
    """No managed stage to use: a query-only client, or a Query without one."""


class PresignUnsupported(FailedPrecondition):
    """The stage cannot mint read capabilities (local stages)."""


class UploadCheckpointMismatch(FailedPrecondition):
    """An upload checkpoint that no longer matches its source file or stage."""


class UploadInProgress(FailedPrecondition):
    """Another process holds the lock of this upload checkpoint."""


class Aborted(LakeError):
    grpc_status = grpc.StatusCode.ABORTED
    retryable = True


class StaleReadVersion(Aborted):
    """A write based on a version that is no longer current."""


class Unauthenticated(LakeError):
    grpc_status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(LakeError):
    grpc_status = grpc.StatusCode.PERMISSION_DENIED


class LocationOutsideStage(PermissionDenied):
    """A DataLocation whose URI is not inside the caller's tenant child prefix."""


class CapabilityRejected(PermissionDenied):
    """Object storage refused a read capability (expired or tampered), or redirected it."""


class ResourceExhausted(LakeError):
    grpc_status = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True


class PayloadTooLarge(ResourceExhausted):
    """A FlightData stream larger than the caller's byte cap (not retryable unchanged)."""

    retryable = False


class ResultTooLarge(ResourceExhausted):
    """An async result past its job's byte ceiling, or a part past 64 MiB (not retryable)."""

    retryable = False


class QueryTooLarge(ResourceExhausted):
    """A query past its memory share or a function-output bound (not retryable unchanged).

    A full admission queue is plain :class:`ResourceExhausted` (retry later);
    this query would fail the same way again until it is narrowed.
    """

    retryable = False


class DeadlineExceeded(LakeError):
    grpc_status = grpc.StatusCode.DEADLINE_EXCEEDED


class QueryCancelled(LakeError):
    """An async query that was cancelled through CancelFlightInfo: its results are gone."""

    grpc_status = grpc.StatusCode.CANCELLED


class Unavailable(LakeError):
    grpc_status = grpc.StatusCode.UNAVAILABLE
    retryable = True


class NotLeader(Unavailable):
    """This Metasrv may not write: it holds no valid lease, or a newer leader fenced it."""


class ObjectStoreUnavailable(Unavailable):
    """Object storage did not answer; the operation may be retried."""


class CommitStateUnknown(LakeError):
    """The commit may or may not have happened: retry with the same operation id."""

    grpc_status = grpc.StatusCode.UNKNOWN
    retryable = True


class Unimplemented(LakeError):
    grpc_status = grpc.StatusCode.UNIMPLEMENTED


class DataCorrupted(LakeError):
    """A stored table data file is not what was written (or cannot be decoded).

    The message names the table and version; never the storage URI, the
    engine's panic text or its build paths.
    """

    grpc_status = grpc.StatusCode.DATA_LOSS


class Internal(LakeError):
    grpc_status = grpc.StatusCode.INTERNAL


class ObjectIntegrityError(Internal):
    """The bytes read are not the ones the DataLocation describes."""

    #: The object's URI ("" when rebuilt from the wire).
    uri: str = ""

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


def _tree(root: type[LakeError]) -> Iterable[type[LakeError]]:
    yield root
    for sub in root.__subclasses__():
        yield from _tree(sub)


#: Every class a Lake server may send, by its wire code. Derived from the tree
#: above (only classes of this module: one table for every client).
WIRE_CLASSES: Final[Mapping[str, type[LakeError]]] = {
    cls.__name__: cls for cls in _tree(LakeError) if cls.__module__ == __name__
}

#: The base class for a gRPC status that came without a Lake code (a proxy, a
#: foreign server). UNKNOWN is absent: it means "unknown" for reads, and an
#: ambiguous outcome for commits (see :func:`error_from_wire`).
_BY_STATUS: Final[Mapping[grpc.StatusCode, type[LakeError]]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.DATA_LOSS: DataCorrupted,
}

#: Statuses that, on a commit without a Lake code, leave its outcome unknown:
#: the request may have been applied before the failure was reported.
_AMBIGUOUS_FOR_COMMITS: Final = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
    }
)


def is_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure to report, not control flow (cancellation, exit).

    Every ``Exception`` is; so is a foreign ``BaseException`` such as pyo3's
    ``PanicException`` (a Rust panic in Lance), which an ``except Exception``
    lets through: an RPC it escaped from was never answered.
    """
    return isinstance(exc, Exception) or not isinstance(
        exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit | GeneratorExit
    )


def wire_trailers(error: LakeError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata a server sends with ``error``."""
    return (
        (ERROR_CODE_KEY, error.code),
        (RETRYABLE_KEY, "true" if error.retryable else "false"),
    )


def _trailer(trailers: Any, key: str) -> str | None:
    """One trailer's value from grpc metadata pairs, a mapping, or pyarrow's lists."""
    if trailers is None:
        return None
    items = trailers.items() if isinstance(trailers, Mapping) else trailers
    for name, value in items:
        if name != key:
            continue
        if isinstance(value, list | tuple):
            value = value[0] if value else ""
        return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    return None


def wire_code(trailers: Any) -> str | None:
    """The ``lake-error-code`` a failed call's trailing metadata carries, if any."""
    return _trailer(trailers, ERROR_CODE_KEY)


def error_from_wire(
    status: grpc.StatusCode,
    message: str,
    trailers: Any = None,
    *,
    commit: bool = False,
) -> LakeError:
    """The Lake error a client raises for a failed call.

    ``trailers`` are the call's trailing metadata (grpc's pairs, or a mapping
    of key to value or list of values). A known ``lake-error-code`` rebuilds
    exactly that class with the server's retryability. Without one (a proxy or
    a foreign server), the status maps to its base class and only UNAVAILABLE
    is retryable; for a commit (``commit=True``) a status that leaves the
    outcome open is :class:`CommitStateUnknown`, to retry with the same
    operation id.
    """
    message = message or status.name
    cls = WIRE_CLASSES.get(wire_code(trailers) or "")
    if cls is not None:
        retryable = _trailer(trailers, RETRYABLE_KEY)
        flag = cls.retryable if retryable is None else retryable == "true"
        return cls.from_wire(message, retryable=flag)
    if commit and (status in _AMBIGUOUS_FOR_COMMITS or status is grpc.StatusCode.UNAVAILABLE):
        return CommitStateUnknown.from_wire(message, retryable=True)
    base = _BY_STATUS.get(status, Internal)
    return base.from_wire(message, retryable=base is Unavailable)
