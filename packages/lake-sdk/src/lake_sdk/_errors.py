"""Lake's typed errors from pyarrow Flight calls.

pyarrow's client hides a failed call's trailing metadata, so a client
middleware (:class:`TrailerCapture`, installed on every FlightClient the SDK
builds) asks the server for wire codes and copies the trailers into the sink
of the call in progress. :func:`calling`
opens that sink; :func:`lake_error` rebuilds the exact class the server sent
(``lake-error-code``) from it. Without a code (a proxy, a foreign server) the
pyarrow exception's family gives the gRPC status, and that status its base
class. No decision here reads the message, which is kept only for people.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from lake_core.errors import WANTS_CODES, LakeError, error_from_wire

__all__ = ["TrailerCapture", "Trailers", "calling", "lake_error"]

#: Trailing metadata of one call, as pyarrow hands headers over (key -> values).
Trailers = dict[str, list[Any]]

_sink: ContextVar[Trailers | None] = ContextVar("lake_sdk_trailers", default=None)

# Arrow's client formats server errors as "Flight returned <code> error, with message: <msg>".
_MESSAGE = re.compile(
    r"with message: (?P<msg>.*?)(?:\. Detail: .*|\. gRPC client debug context: .*)?$", re.S
)

#: The gRPC status behind each pyarrow exception family (most specific first).
_STATUS_BY_TYPE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (flight.FlightUnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (flight.FlightUnauthorizedError, grpc.StatusCode.PERMISSION_DENIED),
    (flight.FlightTimedOutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (flight.FlightUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (flight.FlightCancelledError, grpc.StatusCode.CANCELLED),
    (flight.FlightServerError, grpc.StatusCode.UNKNOWN),
    (flight.FlightInternalError, grpc.StatusCode.INTERNAL),
    (pa.ArrowInvalid, grpc.StatusCode.INVALID_ARGUMENT),
    (pa.ArrowKeyError, grpc.StatusCode.NOT_FOUND),
    (pa.ArrowNotImplementedError, grpc.StatusCode.UNIMPLEMENTED),
)


class _Capture(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, sink: Trailers | None) -> None:
        self._sink = sink

    def sending_headers(self) -> dict[str, str]:
        key, value = WANTS_CODES
        return {key: value}

    def received_headers(self, headers: Trailers) -> None:
        # Called with the initial headers and again with the trailers.
        if self._sink is not None:
            self._sink.update(headers)


class TrailerCapture(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    """Asks for wire codes, and copies each call's headers and trailers into the
    sink opened by :func:`calling`."""

    def start_call(self, info: Any) -> _Capture:
        return _Capture(_sink.get())


@contextlib.contextmanager
def calling() -> Iterator[Trailers]:
    """Open a sink for the trailers of the calls started inside this block.

    The sink is carried by a context variable, so calls made through
    ``asyncio.to_thread`` inside the block fill it too; a stream started here
    keeps filling it when it fails later.
    """
    sink: Trailers = {}
    token = _sink.set(sink)
    try:
        yield sink
    finally:
        _sink.reset(token)


def _server_message(exc: BaseException) -> str:
    text = str(exc)
    match = _MESSAGE.search(text)
    return match.group("msg").strip() if match else text


def _status(exc: BaseException) -> grpc.StatusCode:
    for kind, status in _STATUS_BY_TYPE:
        if isinstance(exc, kind):
            return status
    return grpc.StatusCode.INTERNAL


def lake_error(
    exc: BaseException, trailers: Trailers | None = None, *, commit: bool = False
) -> LakeError:
    """The Lake error for an exception raised by pyarrow's Flight client.

    ``trailers`` is the sink of the failed call (:func:`calling`); ``commit``
    marks appends, whose outcome a codeless failure leaves unknown.
    """
    return error_from_wire(_status(exc), _server_message(exc), trailers, commit=commit)
