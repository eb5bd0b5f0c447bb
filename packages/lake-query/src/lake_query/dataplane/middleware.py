"""Every data-plane call: bearer auth, the RPC metric and span, wire-code opt-in.

pyarrow runs :meth:`CallGuard.start_call` before the handler sees the call,
so a missing or bad token is UNAUTHENTICATED before any ticket work, exactly
as :class:`lake_core.flight.server.LakeServerInterceptor` does on the main
listener (the same :class:`~lake_core.auth.Authenticator`). The call's
``traceparent`` parents its SERVER span and the latency/status series are
the main server's (:class:`lake_core.telemetry.rpc.RpcObservation`).
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pyarrow.flight as flight

from lake_core.auth import Authenticator
from lake_core.errors import CODES_HEADER, LakeError
from lake_core.principal import Principal
from lake_core.telemetry.rpc import RpcObservation
from lake_query.dataplane.statuses import grpc_code

__all__ = ["MIDDLEWARE", "Call", "CallGuard"]

#: The key handlers look the middleware up by (``context.get_middleware``).
MIDDLEWARE = "lake"

_SERVICE = "/arrow.flight.protocol.FlightService/"
_METHODS = {
    flight.FlightMethod.DO_GET: "DoGet",
    flight.FlightMethod.GET_FLIGHT_INFO: "GetFlightInfo",
    flight.FlightMethod.GET_SCHEMA: "GetSchema",
    flight.FlightMethod.DO_PUT: "DoPut",
    flight.FlightMethod.DO_ACTION: "DoAction",
    flight.FlightMethod.LIST_ACTIONS: "ListActions",
    flight.FlightMethod.LIST_FLIGHTS: "ListFlights",
    flight.FlightMethod.DO_EXCHANGE: "DoExchange",
    flight.FlightMethod.HANDSHAKE: "Handshake",
}
#: Headers the span's context is extracted from (W3C trace context).
_TRACE_HEADERS = ("traceparent", "tracestate")


def _first(headers: dict[str, list[Any]], key: str) -> str | None:
    values = headers.get(key)
    if not values:
        return None
    value = values[0]
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


class _Outcome:
    """What RpcObservation asks of a grpc context: its metadata, then its final code."""

    __slots__ = ("code_", "metadata")

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata
        self.code_ = grpc.StatusCode.OK

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def code(self) -> grpc.StatusCode:
        return self.code_


class Call(flight.ServerMiddleware):  # type: ignore[misc]
    """One authenticated call: its principal and whether it asked for wire codes."""

    def __init__(
        self, guard: CallGuard, principal: Principal, wants_codes: bool, observed: Any
    ) -> None:
        self._guard = guard
        self.principal = principal
        self.wants_codes = wants_codes
        self._observed, self._outcome = observed

    def call_completed(self, exception: BaseException | None) -> None:
        self._outcome.code_ = grpc_code(exception)
        self._observed.close(None, self._outcome)
        self._guard._ended()


class CallGuard(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Authenticates every call and counts those in flight (for the drain)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator
        self._lock = threading.Condition()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call is in flight; False if ``timeout_s`` ran out first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._in_flight == 0, timeout_s)

    def _ended(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> Call:
        method = _SERVICE + _METHODS.get(info.method, "other")
        outcome = _Outcome(
            tuple((key, value) for key in _TRACE_HEADERS if (value := _first(headers, key)))
        )
        observed = RpcObservation(method, outcome, counted=True)
        metadata: dict[str, str | bytes] = {}
        token = _first(headers, "authorization")
        if token is not None:
            metadata["authorization"] = token
        try:
            principal = self._authenticator.authenticate(metadata)
        except LakeError as exc:
            outcome.code_ = exc.grpc_status
            observed.close(None, outcome)
            # The only class pyarrow turns into UNAUTHENTICATED from here.
            raise flight.FlightUnauthenticatedError(str(exc)) from None
        with self._lock:
            self._in_flight += 1
        wants = _first(headers, CODES_HEADER) == "1"
        return Call(self, principal, wants, (observed, outcome))
