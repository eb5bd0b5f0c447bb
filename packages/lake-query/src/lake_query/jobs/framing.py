"""The framing check of a stored result part, before any Arrow decoding.

A part is an Arrow IPC stream. DoGet does not decode it: each encapsulated
message (flatbuffer metadata + body) is already a FlightData payload, so the
stream is reframed and forwarded, at most two messages buffered. Before a
message is forwarded its frame is checked by hand: continuation marker,
metadata length within :data:`MAX_METADATA_BYTES`, a well-formed flatbuffer
``Message`` of a known kind, a body length that fits what is left of the part
(and every buffer inside that body), and no ``BodyCompression``: a compressed
batch could declare a decompressed size far past the part's byte ceiling.
The part's size and keyed tag (from the manifest, :mod:`lake_query.jobs.tags`)
are checked as bytes arrive; the last message is released only once both
match at EOF, so a damaged part ends its stream with
:class:`~lake_core.errors.DataCorrupted`.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import AsyncIterator, Iterator

from lake_core.errors import DataCorrupted
from lake_core.flight.encoding import varint
from lake_query.jobs.tags import PartChecker

__all__ = [
    "MAX_METADATA_BYTES",
    "FramingError",
    "PartFrames",
    "check_message",
    "checked_frames",
    "checked_messages",
]

#: Largest flatbuffer metadata of one IPC message in a part.
MAX_METADATA_BYTES = 1024 * 1024

_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3
_CONTINUATION = 0xFFFFFFFF


class FramingError(ValueError):
    """A part that is not a well-formed, uncompressed IPC stream."""


class _Table:
    """Bounds-checked access to one flatbuffer table."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = pos - self._i32(pos)
        self.vt_size = self._u16(self.vtable)
        if self.vt_size < 4 or self.vtable + self.vt_size > len(buf):
            raise FramingError("bad flatbuffer vtable")

    def _u16(self, at: int) -> int:
        value: int = struct.unpack_from("<H", self.buf, at)[0]
        return value

    def _i32(self, at: int) -> int:
        value: int = struct.unpack_from("<i", self.buf, at)[0]
        return value

    def offset(self, field: int) -> int:
        slot = 4 + 2 * field
        return self._u16(self.vtable + slot) if slot < self.vt_size else 0

    def u8(self, field: int) -> int:
        off = self.offset(field)
        return self.buf[self.pos + off] if off else 0

    def i64(self, field: int) -> int:
        off = self.offset(field)
        value: int = struct.unpack_from("<q", self.buf, self.pos + off)[0] if off else 0
        return value

    def table(self, field: int) -> _Table | None:
        off = self.offset(field)
        if not off:
            return None
        at = self.pos + off
        return _Table(self.buf, at + struct.unpack_from("<I", self.buf, at)[0])

    def struct_vector(self, field: int, size: int) -> list[bytes]:
        off = self.offset(field)
        if not off:
            return []
        at = self.pos + off
        start = at + struct.unpack_from("<I", self.buf, at)[0]
        count = struct.unpack_from("<I", self.buf, start)[0]
        end = start + 4 + count * size
        if end > len(self.buf):
            raise FramingError("flatbuffer vector past the metadata")
        return [self.buf[start + 4 + i * size : start + 4 + (i + 1) * size] for i in range(count)]


def _check_batch(batch: _Table | None, body_length: int) -> None:
    if batch is None:
        raise FramingError("a batch message without its batch")
    if batch.offset(3):
        raise FramingError("compressed IPC is refused")
    for raw in batch.struct_vector(2, 16):
        offset, length = struct.unpack("<qq", raw)
        if offset < 0 or length < 0 or offset + length > body_length:
            raise FramingError("a buffer outside its message body")


def check_message(metadata: bytes, remaining: int) -> tuple[int, int]:
    """(kind, body length) of one message's metadata; FramingError if it cannot be served."""
    try:
        message = _Table(metadata, struct.unpack_from("<I", metadata, 0)[0])
        kind = message.u8(1)
        body_length = message.i64(3)
        if body_length < 0 or body_length > remaining or body_length % 8:
            raise FramingError("impossible IPC body length")
        if kind == _SCHEMA:
            if body_length:
                raise FramingError("a schema message with a body")
        elif kind == _RECORD_BATCH:
            _check_batch(message.table(2), body_length)
        elif kind == _DICTIONARY:
            dictionary = message.table(2)
            _check_batch(None if dictionary is None else dictionary.table(1), body_length)
        else:
            raise FramingError("an IPC message of an unexpected kind")
    except (struct.error, IndexError):
        raise FramingError("malformed IPC message metadata") from None
    return kind, body_length


def _flight_data(metadata: bytes, body: list[memoryview]) -> bytes:
    parts: list[bytes | memoryview] = [b"\x12", varint(len(metadata)), metadata]
    length = sum(len(piece) for piece in body)
    if length:
        parts += [b"\xc2\x3e", varint(length), *body]
    # The views point into the part's chunks: this join is a message's only copy.
    return b"".join(parts)


class _Pending:
    """Bytes received but not yet framed, as views of their chunks (no re-buffering)."""

    def __init__(self) -> None:
        self._views: deque[memoryview] = deque()
        self.size = 0

    def append(self, chunk: bytes) -> None:
        if chunk:
            self._views.append(memoryview(chunk).cast("B"))
            self.size += len(chunk)

    def take(self, n: int) -> list[memoryview]:
        """The first ``n`` bytes (``n`` <= size), removed."""
        out: list[memoryview] = []
        while n:
            view = self._views[0]
            if len(view) <= n:
                out.append(self._views.popleft())
                n -= len(view)
            else:
                out.append(view[:n])
                self._views[0] = view[n:]
                n = 0
        self.size -= sum(len(v) for v in out)
        return out

    def peek(self, n: int) -> bytes:
        """A copy of the first ``n`` bytes (``n`` <= size), left in place."""
        out = bytearray()
        for view in self._views:
            out += view[: n - len(out)]
            if len(out) == n:
                break
        return bytes(out)


class PartFrames:
    """Turns a part's chunks into checked FlightData messages (schema first)."""

    def __init__(self, size: int, checker: PartChecker) -> None:
        self._size = size
        self._checker = checker
        self._buffer = _Pending()
        self._seen = 0
        self._messages = 0
        self._ended = False

    def _next(self) -> bytes | None:
        """One complete message from the buffer, or None until more bytes arrive."""
        buffer = self._buffer
        if self._ended:
            if buffer.size:
                raise FramingError("bytes after the end of the IPC stream")
            return None
        if buffer.size < 8:
            return None
        marker, length = struct.unpack("<Ii", buffer.peek(8))
        if marker != _CONTINUATION:
            raise FramingError("missing IPC continuation marker")
        if length == 0:
            buffer.take(8)
            self._ended = True
            if buffer.size:
                raise FramingError("bytes after the end of the IPC stream")
            return None
        if length < 0 or length > MAX_METADATA_BYTES or length > self._size:
            raise FramingError("oversized IPC metadata")
        if buffer.size < 8 + length:
            return None
        metadata = buffer.peek(8 + length)[8:]
        consumed_before = self._seen - buffer.size
        remaining = self._size - consumed_before - 8 - length
        kind, body_length = check_message(metadata, remaining)
        if (self._messages == 0) != (kind == _SCHEMA):
            raise FramingError("a part must start with its one schema message")
        if buffer.size < 8 + length + body_length:
            return None
        buffer.take(8 + length)
        body = buffer.take(body_length)
        self._messages += 1
        return _flight_data(metadata, body)

    def feed(self, chunk: bytes) -> list[bytes]:
        self._seen += len(chunk)
        if self._seen > self._size:
            raise FramingError("the part is longer than its manifest says")
        self._checker.update(chunk)
        self._buffer.append(chunk)
        out = []
        while (message := self._next()) is not None:
            out.append(message)
        return out

    def finish(self) -> None:
        if self._seen != self._size or not self._ended or self._buffer.size:
            raise FramingError("the part is shorter than its manifest says")
        if not self._checker.matches():
            raise FramingError("the part's tag does not match its manifest")


def checked_frames(chunks: Iterator[bytes], size: int, checker: PartChecker) -> Iterator[bytes]:
    """:func:`checked_messages` of a blocking source, on one reader thread.

    Reading, checking and reframing stay on that thread (no hop per chunk);
    the consumer bounds how far ahead it runs.
    """
    frames = PartFrames(size, checker)
    held: bytes | None = None
    try:
        for chunk in chunks:
            for message in frames.feed(chunk):
                if held is not None:
                    yield held
                held = message
        frames.finish()
    except FramingError:
        raise DataCorrupted("an async result part is damaged and was not served") from None
    if held is not None:
        yield held


async def checked_messages(
    chunks: AsyncIterator[bytes], size: int, checker: PartChecker
) -> AsyncIterator[bytes]:
    """FlightData messages of a part; the last one is held until the whole part verifies."""
    frames = PartFrames(size, checker)
    held: bytes | None = None
    try:
        async for chunk in chunks:
            # Checking and reframing a chunk (up to 1 MiB) run off the event loop.
            for message in await asyncio.to_thread(frames.feed, chunk):
                if held is not None:
                    yield held
                held = message
        frames.finish()
    except FramingError:
        raise DataCorrupted("an async result part is damaged and was not served") from None
    if held is not None:
        yield held
