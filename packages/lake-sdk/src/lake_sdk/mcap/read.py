"""Time-range reads of a FILE recording through ``open_file``: only what the window needs.

The ``mcap`` reader seeks: it reads the footer and summary (chunk indexes)
from the end, then only the chunks that overlap the window and carry the
requested topics. Lake serves those reads from an
:class:`~lake_sdk.ObjectFile` with small blocks, except the footer and
summary, which are fetched as exact ranges first (one or two range reads, a
few kilobytes). A recording without chunk indexes is read from the start
(the reader has nothing to seek by), twice: once to index it, once to merge
its chunks in log-time order (:mod:`lake_sdk.mcap.stream`), in bounded memory.
"""

from __future__ import annotations

import asyncio
import io
import json
import struct
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from lake_core.errors import InvalidArgument, LakeError
from lake_core.models import DataLocation
from lake_sdk._object_file import ObjectFile
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap._lib import require
from lake_sdk.mcap.stream import stream_messages
from lake_sdk.mcap.summary import (
    FOOTER_BYTES,
    FOOTER_OPCODE,
    MAGIC,
    RecordingSummary,
    check_summary_crc,
    summarize,
)

__all__ = [
    "BLOCK_SIZE",
    "TAIL_BYTES",
    "Message",
    "Messages",
    "TailedFile",
    "decoder_for",
    "plain",
    "time_ns",
]

#: Blocks of the object file behind a reader: chunks are read whole, so small blocks waste least.
BLOCK_SIZE = 64 * 1024
#: What the first range read takes from the end of a recording (footer, and usually the summary).
TAIL_BYTES = 16 * 1024
#: A summary larger than this is read through the block cache instead of one exact range.
MAX_EXACT_SUMMARY = 8 * 1024 * 1024
#: Messages handed to the event loop per worker-thread step of ``messages_async``.
ASYNC_BATCH = 256
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def time_ns(value: int | datetime | None, what: str) -> int | None:
    """Log time in nanoseconds from an int (ns) or an aware datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidArgument(f"{what} must be an aware datetime (with a time zone)")
        return (value - _EPOCH) // timedelta(microseconds=1) * 1000
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} is log time in nanoseconds (int) or a datetime")
    if value < 0:
        raise InvalidArgument(f"{what} cannot be negative, got {value}")
    return value


def plain(value: Any) -> Any:
    """A decoded ROS 2 message as plain Python: dicts, lists, numbers, strings, bytes."""
    slots = getattr(type(value), "__slots__", None)
    if slots is not None and hasattr(value, "_type"):
        return {name: plain(getattr(value, name)) for name in slots}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def decoder_for(schema: Any, channel: Any, ros2: Any) -> Callable[[bytes], Any] | None:
    """The decoder of one channel's messages to plain values, or None for other encodings."""
    if channel.message_encoding == "json":
        return json.loads
    if channel.message_encoding == "cdr" and ros2 is not None:
        decode = ros2.decoder_for(channel.message_encoding, schema)
        if decode is None:
            return None
        return lambda data: plain(decode(data))
    return None


@dataclass
class Message:
    """One message: its topic, log time (ns), raw bytes and decoded values."""

    topic: str
    log_time_ns: int
    publish_time_ns: int
    sequence: int
    data: bytes
    schema_name: str
    message_encoding: str
    _decode: Callable[[bytes], Any] | None = field(default=None, repr=False, compare=False)
    schema_encoding: str = field(default="", repr=False)
    schema_data: bytes = field(default=b"", repr=False)

    @cached_property
    def decoded(self) -> Any:
        """Plain values (dicts, lists, numbers) for ROS 2 (CDR) and JSON messages, else None."""
        if self._decode is None:
            return None
        try:
            return self._decode(self.data)
        except Exception as exc:
            raise InvalidRecording(
                f"a {self.message_encoding} message on {self.topic} does not decode: "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            ) from None


class TailedFile(io.BufferedIOBase):
    """An ObjectFile whose magic, footer and summary were fetched as exact ranges.

    Reads inside those ranges are served from them; every other read goes
    to the ObjectFile's block cache. Not an ``io.RawIOBase``: mcap would wrap
    that in a BufferedReader that closes it when collected.
    """

    def __init__(self, file: ObjectFile, name: str) -> None:
        super().__init__()
        self._file = file
        self._name = name
        self._position = 0
        size = file.size
        if size < 2 * len(MAGIC) + FOOTER_BYTES:
            raise InvalidRecording(f"{name} is too short to be an MCAP file ({size} bytes)")
        self._head = file.pread(0, len(MAGIC))
        if self._head != MAGIC:
            raise InvalidRecording(
                f"{name} is not an MCAP file (it does not start with MCAP's magic)"
            )
        low = max(0, size - TAIL_BYTES)
        tail = file.pread(low, size)
        if tail[-len(MAGIC) :] != MAGIC:
            raise InvalidRecording(f"{name} is truncated: it does not end with MCAP's magic")
        footer = tail[-(len(MAGIC) + FOOTER_BYTES) : -len(MAGIC)]
        if footer[0] != FOOTER_OPCODE:
            raise InvalidRecording(f"{name} has no MCAP footer before its closing magic")
        (summary_start,) = struct.unpack_from("<Q", footer, 9)
        if 0 < summary_start < low and low - summary_start <= MAX_EXACT_SUMMARY:
            tail = file.pread(summary_start, low) + tail
            low = summary_start
        self._low = low
        self._tail = tail

    @property
    def size(self) -> int:
        return self._file.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._position + offset
        elif whence == io.SEEK_END:
            target = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if target < 0:
            raise ValueError(f"negative seek position {target}")
        self._position = target
        return target

    def read(self, size: int | None = -1, /) -> bytes:
        start = self._position
        end = self.size if size is None or size < 0 else min(self.size, start + size)
        if start >= end:
            return b""
        if start >= self._low:
            out = self._tail[start - self._low : end - self._low]
        elif end <= len(self._head):
            out = self._head[start:end]
        else:
            self._file.seek(start)
            head = self._file.read(min(end, self._low) - start)
            out = head + (self._tail[: end - self._low] if end > self._low else b"")
        self._position = start + len(out)
        return out

    def read1(self, size: int = -1, /) -> bytes:
        return self.read(size)

    def readinto(self, buffer: Any, /) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        super().close()  # the ObjectFile belongs to Messages


class Messages:
    """Messages of one recording in log-time order; iterate once. ``bytes_fetched`` grows as it reads.

    Use it as a context manager (or iterate it to the end) so the file is closed.
    """

    def __init__(
        self,
        file: ObjectFile,
        topics: list[str] | None,
        start_ns: int | None,
        end_ns: int | None,
    ) -> None:
        self._file = file
        self._topics = topics
        self._start = start_ns
        self._end = end_ns
        self.size_bytes = file.size
        self._started = False
        self._tailed: TailedFile | None = None

    @property
    def bytes_fetched(self) -> int:
        """Bytes read from storage so far (the summary, then the chunks the window needs)."""
        return self._file.bytes_fetched

    @property
    def fetches(self) -> int:
        return self._file.fetches

    def _open(self) -> TailedFile:
        if self._tailed is None:
            self._tailed = TailedFile(self._file, self._file.location.uri)
        return self._tailed

    def summary(self) -> RecordingSummary:
        """The recording's summary (from its own summary section; else one pass over it)."""
        return summarize(self._open(), self._file.location.uri)

    def __iter__(self) -> Iterator[Message]:
        if self._started:
            raise InvalidArgument("Messages can be iterated once; call messages() again")
        self._started = True
        try:
            yield from self._read()
        finally:
            self.close()

    def _read(self) -> Iterator[Message]:
        reader_module = require("mcap.reader")
        try:
            ros2: Any = require("mcap_ros2.decoder").DecoderFactory()
        except ImportError:
            ros2 = None
        stream = self._open()
        decoders: dict[int, Callable[[bytes], Any] | None] = {}
        try:
            check_summary_crc(stream, self._file.location.uri)
            for schema, channel, message in self._ordered(reader_module, stream):
                if channel.id not in decoders:
                    decoders[channel.id] = decoder_for(schema, channel, ros2)
                yield Message(
                    channel.topic,
                    message.log_time,
                    message.publish_time,
                    message.sequence,
                    message.data,
                    "" if schema is None else schema.name,
                    channel.message_encoding,
                    decoders[channel.id],
                    "" if schema is None else schema.encoding,
                    b"" if schema is None else schema.data,
                )
        except LakeError:
            raise  # storage faults (and InvalidRecording) are not the recording's fault
        except Exception as exc:  # mcap's own errors, struct.error, decompression, bad UTF-8
            raise InvalidRecording(
                f"{self._file.location.uri} is not a readable MCAP file: "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            ) from None

    def _ordered(self, reader_module: Any, stream: TailedFile) -> Iterator[tuple[Any, Any, Any]]:
        """``(schema, channel, message)`` of the window in log-time order, CRCs checked."""
        reader = _indexed_reader(reader_module, stream)
        if reader is None:
            return stream_messages(stream, self._topics, self._start, self._end)
        return iter(
            reader.iter_messages(
                topics=self._topics,
                starting_at=self._start,
                ending_before=self._end,
                log_time_order=True,
            )
        )

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Messages:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _indexed_reader(reader_module: Any, stream: TailedFile) -> Any:
    """mcap's seeking reader, checking every chunk's CRC; None without chunk indexes.

    A damaged chunk otherwise reads as other messages (or none). Without
    chunk indexes mcap falls back to a linear read that neither passes
    ``validate_crcs`` on nor bounds its memory (it sorts the whole file):
    that case is :func:`~lake_sdk.mcap.stream.stream_messages`'.
    """
    stream.seek(0)
    reader = reader_module.make_reader(stream, validate_crcs=True)
    summary = reader.get_summary()
    return reader if summary is not None and summary.chunk_indexes else None


class AsyncMessages:
    """:class:`Messages` for an AsyncClient: ``async for`` over them (read on a worker thread)."""

    def __init__(self, messages: Messages) -> None:
        self._messages = messages
        self._iterator: Iterator[Message] | None = None

    @property
    def bytes_fetched(self) -> int:
        return self._messages.bytes_fetched

    @property
    def size_bytes(self) -> int:
        return self._messages.size_bytes

    async def summary(self) -> RecordingSummary:
        return await asyncio.to_thread(self._messages.summary)

    def _step(self) -> list[Message]:
        if self._iterator is None:
            self._iterator = iter(self._messages)
        out: list[Message] = []
        for message in self._iterator:
            out.append(message)
            if len(out) >= ASYNC_BATCH:
                break
        return out

    async def __aiter__(self) -> AsyncIterator[Message]:
        try:
            while batch := await asyncio.to_thread(self._step):
                for message in batch:
                    yield message
        finally:
            await self.aclose()

    async def to_list(self) -> list[Message]:
        return [m async for m in self]

    async def aclose(self) -> None:
        await asyncio.to_thread(self._messages.close)

    async def __aenter__(self) -> AsyncMessages:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()


def topic_list(topics: Iterable[str] | str | None) -> list[str] | None:
    if topics is None:
        return None
    names = [topics] if isinstance(topics, str) else list(topics)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a topic is a non-empty string, got {name!r}")
    return names


def check_location(location: Any) -> DataLocation:
    if not isinstance(location, DataLocation):
        raise InvalidArgument("expected the recording's DataLocation (lake_sdk.data_location)")
    return location
