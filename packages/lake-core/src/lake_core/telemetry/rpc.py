"""What the server interceptor records of every RPC: latency, status, span, request id.

:class:`RpcObservation` is opened by :mod:`lake_core.flight.server` once per
call and closed with the call's outcome, so every service is measured and
traced in one place (method and status code labels only). A server that is
not grpc.aio (a pyarrow Flight data plane) opens one per call with
:meth:`RpcObservation.begin` and closes it with :meth:`RpcObservation.end`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import Token
from typing import Any

import grpc
import structlog

from lake_core.telemetry import series
from lake_core.telemetry.tracing import end_server_span, server_span

__all__ = ["RpcObservation", "final_code"]


def final_code(exc: BaseException | None, context: Any) -> grpc.StatusCode:
    """The status a call ended with: OK, the aborted code, CANCELLED or UNKNOWN."""
    if exc is None:
        code = _context_code(context)
        return code if code is not None else grpc.StatusCode.OK
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = _context_code(context)
    if code is not None and code != grpc.StatusCode.OK:
        return code
    return grpc.StatusCode.UNKNOWN


def _context_code(context: Any) -> grpc.StatusCode | None:
    try:
        code = context.code()
    except Exception:
        return None
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):
        return next((c for c in grpc.StatusCode if c.value[0] == code), None)
    return None


class RpcObservation:
    """One server call being measured (see the module docstring)."""

    __slots__ = ("_counted", "_labels", "_span", "_start", "_token")

    def __init__(self, method: str, context: Any, *, counted: bool) -> None:
        """Open the observation of a grpc.aio call (``context`` is its ServicerContext)."""
        self._open(method, context.invocation_metadata() or (), counted, activate=True)

    @classmethod
    def begin(
        cls,
        method: str,
        metadata: Iterable[tuple[str, str | bytes]],
        *,
        counted: bool = True,
        activate: bool = True,
    ) -> RpcObservation:
        """Open the observation of a call served outside grpc.aio; :meth:`end` closes it.

        ``method`` is the gRPC path (``/arrow.flight.protocol.FlightService/DoGet``),
        ``metadata`` the call's headers as ``(key, value)`` pairs (a ``traceparent``
        among them is continued). With ``activate`` the span and the request id
        are made current until :meth:`end`, which must then run in the same
        thread or task; ``activate=False`` changes no context (a server whose
        call ends elsewhere, such as a pyarrow middleware's ``call_completed``).
        """
        observation = cls.__new__(cls)
        observation._open(method, metadata, counted, activate=activate)
        return observation

    def _open(
        self,
        method: str,
        metadata: Iterable[tuple[str, str | bytes]],
        counted: bool,
        *,
        activate: bool,
    ) -> None:
        self._start = time.perf_counter()
        self._labels = series.rpc_labels(method)
        self._counted = counted
        if counted:
            series.RPC_IN_FLIGHT.inc()
        self._span = server_span(method, metadata, activate=activate)
        # A request id on every log line of this call (the RPC runs in its own task):
        # 16 hex digits from the process's PRNG, as the SDK's span ids. Not uuid4:
        # os.urandom releases the GIL, and a busy exporter thread then holds the call.
        self._token: Mapping[str, Token[Any]] | None = (
            structlog.contextvars.bind_contextvars(request_id=f"{random.getrandbits(64):016x}")
            if activate
            else None
        )

    def close(self, exc: BaseException | None, context: Any) -> None:
        """Close with the outcome of a grpc.aio call: its exception (or None) and context."""
        self.end(final_code(exc, context))

    def end(self, code: grpc.StatusCode) -> None:
        """Close with the call's final status: latency, in-flight count, span (call once)."""
        service, method = self._labels
        _rpc_seconds(service, method, code.name)(time.perf_counter() - self._start)
        if self._counted:
            series.RPC_IN_FLIGHT.dec()
        end_server_span(self._span, code)
        if self._token is not None:
            with contextlib.suppress(ValueError):
                structlog.contextvars.reset_contextvars(**self._token)


@functools.lru_cache(maxsize=1024)  # services x methods x codes: a closed, bounded set
def _rpc_seconds(service: str, method: str, code: str) -> Callable[[float], None]:
    return series.RPC_SECONDS.observer(service=service, method=method, code=code)
