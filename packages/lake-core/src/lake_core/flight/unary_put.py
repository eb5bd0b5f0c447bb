"""A small DoPut in one gRPC message: Metasrv's unary append method.

An append is at most 10,000 rows, so its DoPut stream is a handful of
FlightData messages (the schema with the command's descriptor, then the
batches). Sent as a grpc.aio stream, each message and the stream itself cost
Python on both sides about twice what one unary call costs (measured: 16
writers of 1,000-row appends against a server that answers at once, about
1 ms of CPU per append on each side as a stream, 0.5 ms as one message).
So :class:`~lake_core.metaclient.MetaClient` sends an append whose messages
fit :data:`UNARY_MAX_BYTES` as ONE request to :data:`APPEND_METHOD`: the same
FlightData messages, each prefixed by its length, decoded by Metasrv exactly
as its DoPut decodes them. Larger appends (and every bulk ingest) stay
streams.

Framing: ``u32 little-endian length, then that many bytes`` per message, in
stream order, nothing else. The reply is one serialized ``PutResult``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from lake_core.errors import InvalidFlightData
from lake_core.proto import flight_pb2 as pb

__all__ = [
    "APPENDS_SERVICE",
    "APPEND_METHOD",
    "MAX_MESSAGES",
    "UNARY_MAX_BYTES",
    "framed_size",
    "pack",
    "unpack",
]

#: The gRPC service of Metasrv's unary append.
APPENDS_SERVICE = "lake.metasrv.v1.Appends"
#: Its one method's path.
APPEND_METHOD = f"/{APPENDS_SERVICE}/Append"
#: Appends up to this many framed bytes go as one request; larger ones stream.
UNARY_MAX_BYTES = 8 * 1024 * 1024
#: Messages one request may frame (a schema, dictionaries, batches).
MAX_MESSAGES = 4096

_LENGTH = struct.Struct("<I")


def pack(messages: Iterable[bytes]) -> bytes:
    """Frame serialized FlightData ``messages`` (in stream order) as one request body."""
    parts: list[bytes] = []
    for message in messages:
        parts.append(_LENGTH.pack(len(message)))
        parts.append(message)
    return b"".join(parts)


def framed_size(messages: Iterable[bytes]) -> int:
    """The size :func:`pack` makes of ``messages``."""
    return sum(_LENGTH.size + len(m) for m in messages)


def unpack(body: bytes) -> list[pb.FlightData]:
    """The FlightData messages of a request body; InvalidFlightData if it is not one."""
    view = memoryview(body)
    messages: list[pb.FlightData] = []
    pos, end = 0, len(view)
    while pos < end:
        if len(messages) == MAX_MESSAGES:
            raise InvalidFlightData(f"an append request frames more than {MAX_MESSAGES} messages")
        if end - pos < _LENGTH.size:
            raise InvalidFlightData("an append request ends inside a message's length")
        (length,) = _LENGTH.unpack_from(view, pos)
        pos += _LENGTH.size
        if length > end - pos:
            raise InvalidFlightData(
                f"an append request's message says {length} bytes, {end - pos} are left"
            )
        try:
            messages.append(pb.FlightData.FromString(view[pos : pos + length]))
        except Exception:  # protobuf's DecodeError, or a field of the wrong wire type
            raise InvalidFlightData(
                f"an append request's message {len(messages) + 1} is not FlightData"
            ) from None
        pos += length
    if not messages:
        raise InvalidFlightData("an append request frames no message")
    return messages
