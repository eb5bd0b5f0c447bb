"""UUIDv7 operation ids (RFC 9562): time-ordered, so retention can be judged from the id."""

from __future__ import annotations

import os
import time
import uuid

from lake_core.errors import InvalidAppend

__all__ = ["new_operation_id", "operation_time_ms", "parse_operation_id"]


def new_operation_id() -> str:
    """A fresh UUIDv7 as its canonical string."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def parse_operation_id(text: str) -> uuid.UUID:
    """Validate a UUIDv7 operation id, raising InvalidAppend otherwise."""
    try:
        value = uuid.UUID(text)
    except (ValueError, TypeError, AttributeError):
        raise InvalidAppend("operation id must be a UUIDv7 string") from None
    if value.version != 7 or value.variant != uuid.RFC_4122 or str(value) != text:
        raise InvalidAppend("operation id must be a canonical lowercase UUIDv7")
    return value


def operation_time_ms(text: str) -> int:
    """The Unix time in milliseconds embedded in a UUIDv7."""
    return parse_operation_id(text).int >> 80
