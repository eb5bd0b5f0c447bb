"""Flight SQL on the wire: commands, descriptors, tickets and the caller.

Flight SQL commands in descriptors, ``CreatePreparedStatement`` and
``ClosePreparedStatement`` bodies and the ``ActionCreatePreparedStatementResult``
are ``google.protobuf.Any``; ``CancelFlightInfo`` and ``CloseSession`` bodies
and results, and the ``DoPutPreparedStatementResult`` in
``PutResult.app_metadata``, are raw. Lake's own commands (an append's
``AppendCommand``) are versioned JSON objects naming their ``type``.
A descriptor is dispatched on its command's declared type: the ``Any``
type URL of a Flight SQL command, or the ``type`` of a Lake command.
"""

from __future__ import annotations

import json
from typing import TypeVar, cast

from google.protobuf import any_pb2  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.message import (  # type: ignore[import-untyped, unused-ignore]
    DecodeError,
    Message,
)
from pydantic import BaseModel

from lake_core import protocol
from lake_core.errors import InvalidArgument, Unauthenticated, Unimplemented
from lake_core.flight.server import current_principal
from lake_core.principal import Principal
from lake_core.proto import flight_sql_pb2 as sql_pb

__all__ = [
    "MAX_SQL_BYTES",
    "METADATA",
    "METADATA_COMMANDS",
    "PREPARED",
    "QUERY",
    "READ_ONLY_COMMANDS",
    "caller",
    "check_sql",
    "decode_sql",
    "no_transaction",
    "pack",
    "parse_raw",
    "put_command",
    "unpack_any",
    "unpack_as",
]

#: Longest SQL text accepted, in UTF-8 bytes.
MAX_SQL_BYTES = 1024 * 1024

# Ticket and handle body kinds.
QUERY = "q"
METADATA = "m"
PREPARED = "p"

_TYPE_PREFIX = "type.googleapis.com/"
READ_ONLY_COMMANDS = (
    sql_pb.CommandStatementUpdate,
    sql_pb.CommandPreparedStatementUpdate,
    sql_pb.CommandStatementIngest,
)
METADATA_COMMANDS = (
    sql_pb.CommandGetSqlInfo,
    sql_pb.CommandGetCatalogs,
    sql_pb.CommandGetDbSchemas,
    sql_pb.CommandGetTables,
    sql_pb.CommandGetTableTypes,
)
_COMMANDS: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        sql_pb.CommandStatementQuery,
        sql_pb.CommandPreparedStatementQuery,
        sql_pb.CommandGetXdbcTypeInfo,
        sql_pb.CommandGetPrimaryKeys,
        sql_pb.CommandGetExportedKeys,
        sql_pb.CommandGetImportedKeys,
        sql_pb.CommandGetCrossReference,
        sql_pb.CommandStatementSubstraitPlan,
        *METADATA_COMMANDS,
        *READ_ONLY_COMMANDS,
    )
}
#: Lake's own descriptor commands, by their ``type``.
_LAKE_COMMANDS: dict[str, type[BaseModel]] = {
    protocol.APPEND_COMMAND_TYPE: protocol.AppendCommand,
}

M = TypeVar("M", bound=Message)


def pack(message: Message) -> bytes:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return bytes(wrapper.SerializeToString())


def unpack_any(data: bytes, what: str) -> Message:
    """A Flight SQL command from its ``Any`` wrapper."""
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        raise InvalidArgument(f"{what} is not a Flight SQL command") from None
    name = wrapper.type_url.removeprefix(_TYPE_PREFIX)
    cls = _COMMANDS.get(name)
    if cls is None:
        raise InvalidArgument(f"{what} carries an unknown command {name[:200]!r}")
    message = cls()
    try:
        unpacked = wrapper.Unpack(message)
    except DecodeError:  # among others, string fields (SQL) that are not UTF-8
        unpacked = False
    if not unpacked:
        raise InvalidArgument(f"{what} carries a malformed {name} (its text must be UTF-8)")
    return message


def unpack_as(data: bytes, cls: type[M], what: str) -> M:
    wrapper = any_pb2.Any()
    message = cls()
    try:
        wrapper.ParseFromString(data)
        ok = wrapper.Unpack(message)
    except DecodeError:
        ok = False
    if not ok:
        raise InvalidArgument(f"{what} must be an Any-wrapped {cls.DESCRIPTOR.full_name}")
    return cast(M, message)


def parse_raw(data: bytes, cls: type[M], what: str) -> M:
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise InvalidArgument(f"{what} must be a {cls.DESCRIPTOR.full_name}") from None
    return cast(M, message)


def _lake_command_type(data: bytes) -> str | None:
    """The ``type`` of a Lake JSON command, or None if ``data`` is not one."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        return None  # binary: a protobuf Any
    if not isinstance(body, dict):
        return None
    # AppendCommand's ``type`` has a default, so a body without one is an append.
    kind = body.get("type", protocol.APPEND_COMMAND_TYPE)
    if kind not in _LAKE_COMMANDS:
        raise InvalidArgument(f"unknown Lake command type {str(kind)[:100]!r}")
    return str(kind)


def put_command(data: bytes) -> Message | BaseModel:
    """A DoPut descriptor's command: a Lake command or a Flight SQL one, by its type."""
    kind = _lake_command_type(data)
    if kind is not None:
        return protocol.decode(_LAKE_COMMANDS[kind], data)
    return unpack_any(data, "the DoPut descriptor")


def decode_sql(raw: str | bytes) -> str:
    """SQL text as a string; bytes that are not UTF-8 are the client's error."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"SQL text is not valid UTF-8 (byte {exc.start})") from None


def check_sql(sql: str, limit: int = MAX_SQL_BYTES) -> str:
    """Refuse SQL text Lake cannot plan: too long, empty, or holding a NUL character.

    DataFusion names a result column after its expression, and a column name
    holding NUL (a selected string literal holding one) panics when the schema
    crosses to Arrow as C strings: refused here as the caller's input, before
    planning, rather than an internal error.
    """
    if len(sql.encode()) > limit:
        raise InvalidArgument(f"SQL text exceeds {limit} bytes")
    if not sql.strip():
        raise InvalidArgument("SQL text is empty")
    if "\0" in sql:
        where = sql.index("\0")
        raise InvalidArgument(
            f"SQL text holds a NUL character (at {where}); write chr(0) for one in a value"
        )
    return sql


def no_transaction(command: Message) -> None:
    if command.HasField("transaction_id"):
        raise Unimplemented("Lake SQL has no transactions")


def caller() -> Principal:
    """The authenticated principal of the current call."""
    principal = current_principal()
    if not isinstance(principal, Principal):
        raise Unauthenticated("authentication required")
    return principal
