"""Lake errors as pyarrow Flight errors, and back to gRPC status codes.

pyarrow's C++ server turns a Python exception into a gRPC status by its
class, and only a few classes have a status of their own (measured against
pyarrow 26, see docs/dataplane.md): RESOURCE_EXHAUSTED, FAILED_PRECONDITION,
ABORTED, ALREADY_EXISTS and DATA_LOSS cannot be produced and arrive as
UNKNOWN. Lake's own clients still rebuild the exact class: the
``lake-error-code`` / ``lake-retryable`` trailers travel with any status.
"""

from __future__ import annotations

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from lake_core.errors import LakeError

__all__ = ["flight_error", "grpc_code"]

#: The pyarrow exception class pyarrow's server sends as each status.
_CLASS_BY_STATUS: dict[grpc.StatusCode, type[Exception]] = {
    grpc.StatusCode.INVALID_ARGUMENT: pa.ArrowInvalid,
    grpc.StatusCode.NOT_FOUND: pa.ArrowKeyError,
    grpc.StatusCode.UNIMPLEMENTED: pa.ArrowNotImplementedError,
    grpc.StatusCode.UNAUTHENTICATED: flight.FlightUnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: flight.FlightUnauthorizedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: flight.FlightTimedOutError,
    grpc.StatusCode.UNAVAILABLE: flight.FlightUnavailableError,
    grpc.StatusCode.CANCELLED: flight.FlightCancelledError,
    grpc.StatusCode.INTERNAL: flight.FlightInternalError,
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
    """The pyarrow exception whose status is closest to ``error``'s (UNKNOWN if none)."""
    cls = _CLASS_BY_STATUS.get(error.grpc_status, flight.FlightServerError)
    return cls(str(error))


def grpc_code(exc: BaseException | None) -> grpc.StatusCode:
    """The status a call that ended with pyarrow exception ``exc`` reported."""
    if exc is None:
        return grpc.StatusCode.OK
    for cls, code in _STATUS_BY_CLASS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.UNKNOWN
