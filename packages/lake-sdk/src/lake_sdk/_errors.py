"""Turn pyarrow Flight exceptions into Lake's typed errors."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.flight as flight

from lake_core import errors

# Arrow's client formats server errors as "Flight returned <code> error, with message: <msg>".
_MESSAGE = re.compile(
    r"with message: (?P<msg>.*?)(?:\. Detail: .*|\. gRPC client debug context: .*)?$", re.S
)


def _server_message(exc: BaseException) -> str:
    text = str(exc)
    match = _MESSAGE.search(text)
    return match.group("msg").strip() if match else text


def lake_error(exc: BaseException) -> errors.LakeError:
    """The Lake error for an exception raised by pyarrow's Flight client."""
    message = _server_message(exc)
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return errors.Unauthenticated(message)
    if isinstance(exc, flight.FlightUnauthorizedError):
        return errors.PermissionDenied(message)
    if isinstance(exc, flight.FlightTimedOutError):
        return errors.DeadlineExceeded(message)
    if isinstance(exc, flight.FlightUnavailableError | flight.FlightCancelledError):
        return errors.Unavailable(message)
    text = str(exc)
    for status, kind in (
        ("resource exhausted", errors.ResourceExhausted),
        ("failed precondition", errors.FailedPrecondition),
        ("aborted", errors.Aborted),
        ("already exists", errors.AlreadyExists),
        ("not found", errors.NotFound),
        ("unknown error", errors.CommitStateUnknown),
    ):
        if f"returned {status}" in text.lower():
            return kind(message)
    if isinstance(exc, pa.ArrowInvalid):
        if message.startswith("Lake SQL is read-only"):
            return errors.ReadOnlySql(message)
        return errors.InvalidArgument(message)
    if isinstance(exc, pa.ArrowNotImplementedError):
        return errors.Unimplemented(message)
    if isinstance(exc, pa.ArrowKeyError):
        return errors.NotFound(message)
    return errors.Internal(message)
