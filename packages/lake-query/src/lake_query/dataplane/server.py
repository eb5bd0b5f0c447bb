"""The native DoGet data plane: pyarrow's C++ Flight server inside Query.

GetFlightInfo on the main (grpcio) listener advertises this server's URI
in each endpoint's ``location``; clients redeem the same sealed tickets
here, and batches go from the planner to gRPC with no Python framing. The
checks are the main listener's: bearer auth in :mod:`.middleware`, the
ticket opened with the same sealer and principal checks
(:meth:`QueryHandler.open_ticket`), the same admission permit for the
whole stream (taken on this thread when a slot is free, queued on the grpcio
event loop otherwise), and the same planner path. Only
DoGet is served; every other call is UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow.flight as flight
import structlog

from lake_core.errors import Internal, LakeError, Unauthenticated, Unavailable
from lake_core.flight.binding import ensure_address_free
from lake_core.flight.encoding import has_dictionary
from lake_core.principal import Principal
from lake_core.security import ServerSecurity
from lake_query.dataplane.middleware import MIDDLEWARE, Call, CallGuard
from lake_query.dataplane.settings import DataPlaneSettings
from lake_query.dataplane.streams import ServedStream, Watchdog, failure, one_batch
from lake_query.flightsql import wire
from lake_query.flightsql.endpoints import PARTITION
from lake_query.serving.admission import Admission, Permit

if TYPE_CHECKING:
    from lake_query.flightsql.handler import QueryHandler

__all__ = ["DataPlane", "release_if_granted", "releaser"]

log = structlog.get_logger("lake_query.dataplane")

#: Kinds of ticket this server redeems (async parts stay on the main listener).
SERVED_KINDS = (wire.QUERY, PARTITION, wire.METADATA)
#: How long shutdown waits for pyarrow's server once every stream was ended.
_STOP_WAIT_S = 10.0


class DataPlane(flight.FlightServerBase):  # type: ignore[misc]
    """The data plane of one Query replica; binds and serves on construction."""

    def __init__(
        self,
        settings: DataPlaneSettings,
        handler: QueryHandler,
        admission: Admission,
        security: ServerSecurity,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        ensure_address_free(settings.addr)
        self.settings = settings
        self.uri = settings.uri(tls=security.tls is not None)
        self.guard = CallGuard(security.authenticator)
        self._handler = handler
        self._admission = admission
        self._loop = loop
        self._draining = False
        pair = security.tls_pair
        location = ("grpc+tls://" if pair else "grpc+tcp://") + settings.addr
        super().__init__(
            location,
            tls_certificates=[flight.CertKeyPair(pair[0], pair[1])] if pair else [],
            middleware={MIDDLEWARE: self.guard},
        )
        limits = admission.limits
        self.watchdog = Watchdog(self.port, limits.stall_timeout_ms, limits.execution_timeout_ms)

    def __repr__(self) -> str:
        return f"DataPlane({self.uri})"

    # -- DoGet ------------------------------------------------------------

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        call: Call = context.get_middleware(MIDDLEWARE)
        try:
            return self._stream(context, call, ticket.ticket)
        except LakeError as exc:
            raise failure(context, call.wants_codes, exc) from None
        except Exception as exc:
            # Never a non-Flight exception: pyarrow would send its traceback.
            log.exception("data plane DoGet failed", error_type=type(exc).__name__)
            raise failure(context, call.wants_codes, Internal("the query failed")) from None

    def _stream(self, context: Any, call: Call, ticket: bytes) -> flight.FlightDataStream:
        if self._draining:
            raise Unavailable("this Query replica is shutting down; retry the query")
        principal = call.principal
        body = self._handler.open_ticket(ticket, principal)
        kind = body.get("k")
        if kind not in SERVED_KINDS:
            raise Unauthenticated("invalid ticket")
        if kind == wire.METADATA:
            batch = self._handler.metadata_batch(body, principal)
            return flight.GeneratorStream(batch.schema, one_batch(batch))
        query = self._handler.query_of(body)  # refused before admission
        permit = self._admit(principal)
        release = releaser(self._loop, permit)
        try:
            result = self._handler.result_stream(query, principal)
        except BaseException:
            release()
            raise
        if has_dictionary(result.schema):
            # Never advertised for such results (replacement dictionaries need Lake's encoder).
            result.close()
            release()
            raise Unavailable("this result has dictionary columns: redeem it on the main listener")
        stream = ServedStream(
            result,
            release,
            peer=context.peer(),
            deadline=time.monotonic() + self._admission.limits.execution_timeout_ms / 1000,
            on_end=self.watchdog.remove,
        )
        self.watchdog.add(stream)
        batches = stream.batches(context, call.wants_codes)
        # A generator pyarrow drops before its first batch never enters its ``finally``.
        weakref.finalize(batches, stream.close)
        return flight.GeneratorStream(result.schema, batches)

    def _admit(self, principal: Principal) -> Permit:
        """The tenant's admission permit: at once when a slot is free, else queued on the loop.

        The loop hop (a thread wake-up each way) was a fixed cost of every DoGet.
        """
        permit = self._admission.try_acquire(principal.tenant_id)
        if permit is not None:
            return permit
        future = asyncio.run_coroutine_threadsafe(
            self._admission.acquire(principal.tenant_id), self._loop
        )
        # The queue deadline bounds the wait; the margin covers a busy loop.
        bound = self._admission.limits.queue_timeout_ms / 1000 + 30
        try:
            return future.result(bound)
        except FutureTimeout:
            if not future.cancel():
                # Granted as the wait ran out: nobody will stream with it.
                future.add_done_callback(partial(release_if_granted, self._loop))
            raise Unavailable("admission did not answer in time; retry the query") from None

    # -- drain ------------------------------------------------------------

    def drain(self, grace_s: float) -> int:
        """Refuse new DoGets, let streams finish within ``grace_s``, end the rest, stop.

        Returns how many streams were cut off. Blocking: call it on a worker thread.
        """
        self._draining = True
        left = 0
        if not self.guard.wait_idle(grace_s):
            left = self.watchdog.drain()
            self.guard.wait_idle(_STOP_WAIT_S)
        self.watchdog.close()
        stopper = threading.Thread(target=self.shutdown, name="lake-dataplane-stop", daemon=True)
        stopper.start()
        stopper.join(_STOP_WAIT_S)
        if stopper.is_alive():
            log.error("the data plane did not stop in time")
            left = max(left, 1)
        return left


def releaser(loop: asyncio.AbstractEventLoop, permit: Permit) -> Callable[[], None]:
    """A thread-safe release of ``permit``, whose admission gates live on ``loop``."""

    def release() -> None:
        # Here when nobody queues for the slots (no wake-up of the loop on every
        # DoGet's end), else on the loop, which wakes the next waiter. Both are
        # idempotent. RuntimeError: the loop is closed, the process is exiting.
        if permit.release_if_unwaited():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(permit.release)

    return release


def release_if_granted(loop: asyncio.AbstractEventLoop, future: Future[Permit]) -> None:
    """Release the permit of an admission that completed after its caller gave up."""
    if not future.cancelled() and future.exception() is None:
        releaser(loop, future.result())()
