"""Flight service behaviour and the generic gRPC handler that serves it.

A :class:`FlightHandler` overrides the Flight methods its service supports;
:func:`flight_generic_handler` turns it into grpc.aio method handlers. Every
handler exception ends the RPC through :func:`abort_with`: a
:class:`LakeError` with its status, message and (to Lake clients) wire code,
anything else as INTERNAL "internal server error", logged here.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc

from lake_core.errors import (
    CODES_HEADER,
    Internal,
    LakeError,
    Unimplemented,
    is_failure,
    wire_trailers,
)
from lake_core.proto import flight_pb2 as pb
from lake_core.protocol import MAX_MESSAGE_BYTES

__all__ = [
    "FLIGHT_SERVICE",
    "FlightHandler",
    "abort_for_exception",
    "abort_with",
    "bytes_service",
    "flight_generic_handler",
]

logger = logging.getLogger("lake_core.flight.server")

FLIGHT_SERVICE = "arrow.flight.protocol.FlightService"
#: Bounds of reading a refused client stream to its end (see ``_drain``).
DRAIN_MAX_BYTES = 2 * MAX_MESSAGE_BYTES
DRAIN_MAX_S = 10.0

# grpc ships no type information; this alias keeps signatures readable.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

_T = TypeVar("_T")


def _wants_codes(context: Context) -> bool:
    return any(
        key == CODES_HEADER and value == "1" for key, value in context.invocation_metadata() or ()
    )


async def abort_with(context: Context, error: LakeError) -> NoReturn:
    """End the RPC with ``error``: its gRPC status, message and (to Lake clients) wire code."""
    if _wants_codes(context):
        context.set_trailing_metadata(wire_trailers(error))
    await context.abort(error.grpc_status, str(error))
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


async def abort_for_exception(context: Context, exc: BaseException, method: str) -> NoReturn:
    """Abort the RPC for a handler exception without leaking internals."""
    if isinstance(exc, LakeError):
        await abort_with(context, exc)
    logger.error("unhandled error in %s", method, exc_info=exc)
    await abort_with(context, Internal("internal server error"))


def _unary(
    method: str, fn: Callable[[Any, Context], Awaitable[_T]]
) -> Callable[[Any, Context], Awaitable[_T]]:
    async def behavior(request: Any, context: Context) -> _T:
        try:
            return await fn(request, context)
        except grpc.aio.AbortError:
            raise
        except BaseException as exc:
            if not is_failure(exc):
                raise
            await abort_for_exception(context, exc, method)

    return behavior


async def _drain(requests: AsyncIterator[Any]) -> None:
    """Read what the client is still sending, within bounds, before failing its call.

    A server that ends a client-streaming call while the client is still
    writing makes the client see INTERNAL instead of the server's status
    (grpc reports the failed write). Refusals such as PERMISSION_DENIED on a
    DoPut must reach the caller intact, so the rest of the stream is read and
    discarded first: at most :data:`DRAIN_MAX_BYTES` for :data:`DRAIN_MAX_S`.
    Only authenticated callers get here (the interceptor aborts the others).
    """
    received = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_MAX_S
    try:
        async with asyncio.timeout_at(deadline):
            async for message in requests:
                received += message.ByteSize() if hasattr(message, "ByteSize") else 0
                if received > DRAIN_MAX_BYTES:
                    return
    except Exception:
        # Out of time, the stream already failed, or it is being read elsewhere
        # (a forwarding handler): give up; the client may then see INTERNAL.
        return


def _streaming(
    method: str,
    fn: Callable[[Any, Context], AsyncIterator[_T]],
    *,
    drain_requests: bool = False,
) -> Callable[[Any, Context], AsyncIterator[_T]]:
    async def behavior(request: Any, context: Context) -> AsyncIterator[_T]:
        try:
            async for item in fn(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except BaseException as exc:
            if not is_failure(exc):
                raise
            if drain_requests:
                await _drain(request)
            await abort_for_exception(context, exc, method)

    return behavior


def _unimplemented(method: str) -> Unimplemented:
    return Unimplemented(f"{method} is not implemented by this service")


class FlightHandler(abc.ABC):  # noqa: B024 - every method has a default
    """Flight service behaviour; override what the service supports.

    Unary methods return a protobuf message; streaming methods are async
    generators. ``do_get`` yields already-encoded FlightData ``bytes``
    (see :mod:`lake_core.flight.encoding`). A :class:`LakeError` reaches the
    client with its status, message and wire code (``lake-error-code``);
    any other exception as INTERNAL "internal server error".
    """

    async def handshake(
        self, requests: AsyncIterator[pb.HandshakeRequest], context: Context
    ) -> AsyncIterator[pb.HandshakeResponse]:
        raise _unimplemented("Handshake")
        yield  # makes this an async generator

    async def list_flights(
        self, criteria: pb.Criteria, context: Context
    ) -> AsyncIterator[pb.FlightInfo]:
        raise _unimplemented("ListFlights")
        yield

    async def get_flight_info(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.FlightInfo:
        raise _unimplemented("GetFlightInfo")

    async def poll_flight_info(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.PollInfo:
        raise _unimplemented("PollFlightInfo")

    async def get_schema(
        self, descriptor: pb.FlightDescriptor, context: Context
    ) -> pb.SchemaResult:
        raise _unimplemented("GetSchema")

    async def do_get(self, ticket: pb.Ticket, context: Context) -> AsyncIterator[bytes]:
        raise _unimplemented("DoGet")
        yield

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Context
    ) -> AsyncIterator[pb.PutResult]:
        raise _unimplemented("DoPut")
        yield

    async def do_exchange(
        self, messages: AsyncIterator[pb.FlightData], context: Context
    ) -> AsyncIterator[pb.FlightData | bytes]:
        raise _unimplemented("DoExchange")
        yield

    async def do_action(self, action: pb.Action, context: Context) -> AsyncIterator[pb.Result]:
        raise _unimplemented("DoAction")
        yield

    async def list_actions(self, context: Context) -> AsyncIterator[pb.ActionType]:
        raise _unimplemented("ListActions")
        yield

    def extra_services(self) -> Sequence[grpc.GenericRpcHandler]:
        """Services the server carries beside Flight (built with :func:`bytes_service`)."""
        return ()


def _identity(data: bytes) -> bytes:
    return data


def _bytes_or_message(message: pb.FlightData | bytes) -> bytes:
    # DoExchange may send pre-encoded FlightData like DoGet, or messages.
    return message if isinstance(message, bytes) else message.SerializeToString()


def bytes_service(
    service: str, methods: Mapping[str, Callable[[bytes, Context], Awaitable[bytes]]]
) -> grpc.GenericRpcHandler:
    """A service of unary methods taking and returning raw bytes.

    Errors end the call as on the Flight methods (:func:`abort_with`), and the
    server's interceptor authenticates and counts each call the same way.
    """
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _unary(f"{service}/{name}", fn),
            request_deserializer=_identity,
            response_serializer=_identity,
        )
        for name, fn in methods.items()
    }
    return grpc.method_handlers_generic_handler(service, handlers)


def flight_generic_handler(handler: FlightHandler) -> grpc.GenericRpcHandler:
    """Raw generic handler for ``arrow.flight.protocol.FlightService``."""

    def list_actions(_: pb.Empty, context: Context) -> AsyncIterator[pb.ActionType]:
        return handler.list_actions(context)

    unary_stream = grpc.unary_stream_rpc_method_handler
    stream_stream = grpc.stream_stream_rpc_method_handler
    unary_unary = grpc.unary_unary_rpc_method_handler
    methods = {
        "Handshake": stream_stream(
            _streaming("Handshake", handler.handshake),
            request_deserializer=pb.HandshakeRequest.FromString,
            response_serializer=pb.HandshakeResponse.SerializeToString,
        ),
        "ListFlights": unary_stream(
            _streaming("ListFlights", handler.list_flights),
            request_deserializer=pb.Criteria.FromString,
            response_serializer=pb.FlightInfo.SerializeToString,
        ),
        "GetFlightInfo": unary_unary(
            _unary("GetFlightInfo", handler.get_flight_info),
            request_deserializer=pb.FlightDescriptor.FromString,
            response_serializer=pb.FlightInfo.SerializeToString,
        ),
        "PollFlightInfo": unary_unary(
            _unary("PollFlightInfo", handler.poll_flight_info),
            request_deserializer=pb.FlightDescriptor.FromString,
            response_serializer=pb.PollInfo.SerializeToString,
        ),
        "GetSchema": unary_unary(
            _unary("GetSchema", handler.get_schema),
            request_deserializer=pb.FlightDescriptor.FromString,
            response_serializer=pb.SchemaResult.SerializeToString,
        ),
        "DoGet": unary_stream(
            _streaming("DoGet", handler.do_get),
            request_deserializer=pb.Ticket.FromString,
            response_serializer=_identity,
        ),
        "DoPut": stream_stream(
            _streaming("DoPut", handler.do_put, drain_requests=True),
            request_deserializer=pb.FlightData.FromString,
            response_serializer=pb.PutResult.SerializeToString,
        ),
        "DoExchange": stream_stream(
            _streaming("DoExchange", handler.do_exchange, drain_requests=True),
            request_deserializer=pb.FlightData.FromString,
            response_serializer=_bytes_or_message,
        ),
        "DoAction": unary_stream(
            _streaming("DoAction", handler.do_action),
            request_deserializer=pb.Action.FromString,
            response_serializer=pb.Result.SerializeToString,
        ),
        "ListActions": unary_stream(
            _streaming("ListActions", list_actions),
            request_deserializer=pb.Empty.FromString,
            response_serializer=pb.ActionType.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(FLIGHT_SERVICE, methods)
