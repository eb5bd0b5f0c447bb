"""Lake errors as pyarrow Flight errors, and back to gRPC status codes.

pyarrow's C++ server turns a Python exception into a gRPC status by its
class (measured against pyarrow 26, see docs/dataplane.md). Only the
``Flight*Error`` classes are safe to raise: any other exception (ArrowInvalid,
ArrowKeyError, ...) sends the Python traceback, with source paths, to the
client in ``x-arrow-status-detail-bin``. So INVALID_ARGUMENT, NOT_FOUND and
UNIMPLEMENTED, which have no Flight class, and RESOURCE_EXHAUSTED,
FAILED_PRECONDITION, ABORTED, ALREADY_EXISTS and DATA_LOSS, which pyarrow
cannot produce at all, reach foreign clients (ADBC, pyarrow) as their
nearest safe status; a retryable ResourceExhausted (a full admission queue)
as UNAVAILABLE, which tells every client to retry. CANCELLED is never sent:
pyarrow's ``read_all`` turns a CANCELLED stream into a KeyboardInterrupt in
the reader's main thread. Lake's own clients rebuild the exact class from the
``lake-error-code`` / ``lake-retryable`` trailers, which travel with any status.
"""

from __future__ import annotations

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from lake_core.errors import LakeError

__all__ = ["flight_error", "grpc_code"]

#: The Flight exception class sent for each status; others are FlightServerError (UNKNOWN).
_CLASS_BY_STATUS: dict[grpc.StatusCode, type[Exception]] = {
    grpc.StatusCode.UNAUTHENTICATED: flight.FlightUnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: flight.FlightUnauthorizedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: flight.FlightTimedOutError,
    grpc.StatusCode.UNAVAILABLE: flight.FlightUnavailableError,
    grpc.StatusCode.INTERNAL: flight.FlightInternalError,
    grpc.StatusCode.DATA_LOSS: flight.FlightInternalError,
}

#: Most specific first: the status each pyarrow exception family arrives as.
_STATUS_BY_CLASS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (flight.FlightUnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (flight.FlightUnauthorizedError, grpc.StatusCode.PERMISSION_DENIED),
    (flight.FlightTimedOutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (flight.FlightUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (flight.FlightCancelledError, grpc.StatusCode.CANCELLED),
    (flight.FlightInternalError, grpc.StatusCode.INTERNAL),
    (pa.ArrowInvalid, grpc.StatusCode.INVALID_ARGUMENT),
    (pa.ArrowKeyError, grpc.StatusCode.NOT_FOUND),
    (pa.ArrowNotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
)


def flight_error(error: LakeError) -> Exception:
    """The Flight exception whose status is closest to ``error``'s (UNKNOWN if none)."""
    status = error.grpc_status
    if status is grpc.StatusCode.RESOURCE_EXHAUSTED and error.retryable:
        return flight.FlightUnavailableError(str(error))
    cls = _CLASS_BY_STATUS.get(status, flight.FlightServerError)
    return cls(str(error))


def grpc_code(exc: BaseException | None) -> grpc.StatusCode:
    """The status a call that ended with pyarrow exception ``exc`` reported."""
    if exc is None:
        return grpc.StatusCode.OK
    for cls, code in _STATUS_BY_CLASS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.UNKNOWN
