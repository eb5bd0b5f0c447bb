"""``grpc.aio`` scaffolding for Lake's Arrow Flight services.

One server carries ``arrow.flight.protocol.FlightService`` (built from a
:class:`FlightHandler`) and standard gRPC Health on the same port. An
interceptor authenticates each call, publishes the principal through a
context variable and counts in-flight RPCs so shutdown can report whether
the grace period was enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar, Token
from typing import Any, TypeAlias, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lake_core.config import SHUTDOWN_GRACE_MS as GRACE_ENV
from lake_core.errors import (
    ConfigError,
    Unauthenticated,
)
from lake_core.flight.binding import NO_PORT_REUSE, ensure_address_free
from lake_core.flight.handler import (
    FLIGHT_SERVICE,
    FlightHandler,
    abort_for_exception,
    abort_with,
    flight_generic_handler,
)
from lake_core.protocol import MAX_MESSAGE_BYTES
from lake_core.telemetry.rpc import RpcObservation

__all__ = [
    "FLIGHT_SERVICE",
    "HEALTH_SERVICE",
    "MAX_MESSAGE_BYTES",
    "Authenticator",
    "FlightHandler",
    "FlightServer",
    "LakeServerInterceptor",
    "UncleanShutdown",
    "abort_with",
    "current_principal",
    "flight_generic_handler",
    "serve",
    "shutdown_grace_ms",
]

logger = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"
MAX_METADATA_BYTES = 64 * 1024
DEFAULT_GRACE_MS = 30_000

# grpc ships no type information; this alias keeps signatures readable.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Metadata: TypeAlias = dict[str, str | bytes]
#: ``authenticate(metadata, peer, method)`` returns the principal (or an
#: awaitable of it); it raises a :class:`LakeError` to reject.
Authenticator: TypeAlias = Callable[[Metadata, str, str], object]

_T = TypeVar("_T")
_principal: ContextVar[object | None] = ContextVar("lake_principal", default=None)


def current_principal() -> object | None:
    """The principal the interceptor authenticated for the running RPC."""
    return _principal.get()


def shutdown_grace_ms(env: Mapping[str, str] = os.environ) -> int:
    """Shutdown grace from ``LAKE_SHUTDOWN_GRACE_MS`` (positive int ms, default 30000)."""
    raw = env.get(GRACE_ENV)
    if raw is None:
        return DEFAULT_GRACE_MS
    # int() would also take "+5", "1_000" and non-ASCII digits; be strict.
    if not re.fullmatch(r"[0-9]+", raw.strip()) or int(raw) <= 0:
        raise ConfigError(f"{GRACE_ENV} must be a positive integer of milliseconds, got {raw!r}")
    return int(raw)


class UncleanShutdown(RuntimeError):
    """RPCs were still running when the shutdown grace period ran out."""

    def __init__(self, in_flight: int, grace_ms: int) -> None:
        super().__init__(f"{in_flight} RPC(s) still in flight after {grace_ms} ms grace")
        self.in_flight = in_flight


def _metadata(context: Context) -> Metadata:
    # First value wins for repeated keys, so a later duplicate cannot override.
    result: Metadata = {}
    for key, value in context.invocation_metadata() or ():
        result.setdefault(key, value)
    return result


class LakeServerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc, unused-ignore]
    """Authenticates calls, sets :func:`current_principal`, counts in-flight RPCs.

    Every service is authenticated, gRPC Health included. Methods of
    ``uncounted_services`` (Health by default) are not counted in flight:
    long-lived health watches must not hold up the drain. Methods of
    ``public_services`` (none by default) skip authentication and counting.
    """

    def __init__(
        self,
        authenticate: Authenticator | None = None,
        *,
        public_services: Sequence[str] = (),
        uncounted_services: Sequence[str] = (HEALTH_SERVICE,),
    ) -> None:
        self._authenticate = authenticate
        self._public = tuple(f"/{name}/" for name in public_services)
        self._uncounted = tuple(f"/{name}/" for name in uncounted_services)
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._shutting_down = False
        self.cancelled_in_shutdown = 0

    @property
    def in_flight(self) -> int:
        """RPCs currently running (excluding public services)."""
        return self._in_flight

    def begin_shutdown(self) -> None:
        """From now on, count RPCs that end by cancellation as cut off."""
        self._shutting_down = True

    async def wait_idle(self, grace_s: float) -> bool:
        """Wait until no RPC is in flight; False if ``grace_s`` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            return False
        return True

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or (self._public and method.startswith(self._public)):
            return handler
        counted = not (self._uncounted and method.startswith(self._uncounted))
        return _wrap_handler(handler, method, self, counted=counted)

    async def _enter(
        self, method: str, context: Context, counted: bool = True
    ) -> Token[object | None]:
        if counted:
            self._in_flight += 1
            self._idle.clear()
        try:
            principal = await self._principal_for(method, context)
        except BaseException:
            self._exit(counted)
            raise
        return _principal.set(principal)

    def _exit(self, counted: bool = True) -> None:
        if not counted:
            return
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    async def _principal_for(self, method: str, context: Context) -> object | None:
        if self._authenticate is None:
            return None
        try:
            principal = self._authenticate(_metadata(context), context.peer(), method)
            if inspect.isawaitable(principal):
                principal = await principal
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort_for_exception(context, exc, method)
        if principal is None:
            # Fail closed: an authenticator that returns nothing did not authenticate.
            await abort_with(context, Unauthenticated("authentication required"))
        return principal

    def _leave(
        self, token: Token[object | None], exc: BaseException | None, counted: bool = True
    ) -> None:
        if counted and isinstance(exc, asyncio.CancelledError) and self._shutting_down:
            self.cancelled_in_shutdown += 1
        # Reset fails if the generator is finalized in another context; harmless.
        with contextlib.suppress(ValueError):
            _principal.reset(token)
        self._exit(counted)


def _wrap_handler(
    handler: grpc.RpcMethodHandler,
    method: str,
    guard: LakeServerInterceptor,
    *,
    counted: bool = True,
) -> grpc.RpcMethodHandler:
    """Same handler, with every call run inside ``guard``'s enter/leave."""
    if handler.request_streaming and handler.response_streaming:
        factory, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
    elif handler.request_streaming:
        factory, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
    elif handler.response_streaming:
        factory, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
    else:
        factory, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary

    if inspect.isasyncgenfunction(behavior):

        async def wrapped_gen(request: Any, context: Context) -> AsyncIterator[Any]:
            observed = RpcObservation(method, context, counted=counted)
            exc: BaseException | None = None
            try:
                token = await guard._enter(method, context, counted)
            except BaseException as e:
                observed.close(e, context)
                raise
            try:
                async for item in behavior(request, context):
                    yield item
            except BaseException as e:
                exc = e
                raise
            finally:
                guard._leave(token, exc, counted)
                observed.close(exc, context)

        wrapped: Callable[..., Any] = wrapped_gen
    else:
        # Coroutine behaviours (including streaming ones using context.write).
        async def wrapped_coro(request: Any, context: Context) -> Any:
            observed = RpcObservation(method, context, counted=counted)
            exc: BaseException | None = None
            try:
                token = await guard._enter(method, context, counted)
            except BaseException as e:
                observed.close(e, context)
                raise
            try:
                return await behavior(request, context)
            except BaseException as e:
                exc = e
                raise
            finally:
                guard._leave(token, exc, counted)
                observed.close(exc, context)

        wrapped = wrapped_coro
    return factory(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class FlightServer:
    """A ``grpc.aio`` server carrying a Flight handler and gRPC Health."""

    def __init__(
        self,
        handler: FlightHandler,
        *,
        authenticate: Authenticator | None = None,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.guard = LakeServerInterceptor(authenticate)
        self.health = health.aio.HealthServicer()
        self.port: int | None = None
        # The guard goes first so authentication precedes other interceptors.
        self._server = grpc.aio.server(
            interceptors=[self.guard, *interceptors],
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Room for a delegated principal's grants (lake_core.auth).
                ("grpc.max_metadata_size", MAX_METADATA_BYTES),
                NO_PORT_REUSE,
                *options,
            ],
        )
        self._server.add_generic_rpc_handlers(
            (flight_generic_handler(handler), *handler.extra_services())
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)

    async def start(
        self, addr: str, tls: tuple[bytes, bytes] | None = None, *, serving: bool = True
    ) -> int:
        """Bind ``addr`` (TLS if ``tls=(cert_pem, key_pem)``), start, return the port.

        ``serving``: the gRPC Health status it starts with (False: NOT_SERVING
        until :meth:`set_serving`). Raises ConfigError naming ``addr`` when
        another process serves it.
        """
        ensure_address_free(addr)
        try:
            if tls is None:
                port: int = self._server.add_insecure_port(addr)
            else:
                cert_pem, key_pem = tls
                creds = grpc.ssl_server_credentials([(key_pem, cert_pem)])
                port = self._server.add_secure_port(addr, creds)
        except RuntimeError:
            # grpc's only bind failure; a busy port is the cause once the probe passed
            # (a race with another starting server), an unbindable host fails the probe.
            ensure_address_free(addr)
            raise OSError(f"could not bind {addr}") from None
        if not port:
            raise OSError(f"could not bind {addr}")
        await self._server.start()
        self.port = port
        await self.set_serving(serving)
        return port

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING / NOT_SERVING for the server and the Flight service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", FLIGHT_SERVICE):
            await self.health.set(service, status)

    async def shutdown(self, grace_s: float) -> int:
        """NOT_SERVING, stop accepting, drain; return RPCs cut off by the grace."""
        await self.health.enter_graceful_shutdown()
        self.guard.begin_shutdown()
        stop = asyncio.create_task(self._server.stop(grace_s))
        drained = await self.guard.wait_idle(grace_s)
        left = 0 if drained else self.guard.in_flight
        await stop
        return max(left, self.guard.cancelled_in_shutdown)


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, callback: Callable[[], None]
) -> list[signal.Signals]:
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, callback)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread, or a platform without loop signal support.
            logger.warning("cannot install a handler for %s", sig.name)
            continue
        installed.append(sig)
    return installed


async def serve(
    handler: FlightHandler,
    addr: str,
    *,
    authenticate: Authenticator | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    tls: tuple[bytes, bytes] | None = None,
    grace_ms: int | None = None,
    on_started: Callable[[FlightServer], object] | None = None,
    stop: asyncio.Event | None = None,
    serving: Callable[[], bool] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set), then drain gracefully.

    ``serving``: whether the process is ready, for the gRPC Health status it
    binds with (default: SERVING); ``on_started`` keeps it current after.

    Raises :class:`UncleanShutdown` when RPCs were still running as the grace
    period (``grace_ms``, default :func:`shutdown_grace_ms`) ran out, so the
    CLI can exit non-zero.
    """
    grace = shutdown_grace_ms() if grace_ms is None else grace_ms
    if grace <= 0:
        raise ValueError("grace_ms must be positive")
    server = FlightServer(handler, authenticate=authenticate, interceptors=interceptors)
    stop_event = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    await server.start(addr, tls, serving=True if serving is None else serving())
    installed = _install_signal_handlers(loop, stop_event.set)
    try:
        logger.info("Flight server listening on port %s", server.port)
        if on_started is not None:
            on_started(server)
        # Everything imported and built so far lives as long as the process:
        # keep it out of the collector's full passes, which otherwise stall
        # the event loop for tens of milliseconds at a time under load.
        gc.freeze()
        await stop_event.wait()
        logger.info("shutting down (grace %d ms)", grace)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        left = await server.shutdown(grace / 1000)
    if left:
        logger.error("shutdown grace of %d ms ran out with %d RPC(s) in flight", grace, left)
        raise UncleanShutdown(left, grace)
