"""Log-time-ordered messages of a recording without chunk indexes, in bounded memory.

mcap's reader sorts such a file's messages in memory (``NonSeekingReader``
with ``log_time_order``): a recorder killed mid-file or a streamed
recording of gigabytes would be held whole. Here two passes over the
(seekable) stream replace the missing index:

1. One pass over the records, chunk by chunk with every CRC checked, builds
   the index: the channels and schemas, and for each chunk (or run of loose
   messages) its byte range and the log-time span of its wanted messages.
2. The groups are merged in log-time order exactly as mcap's seeking reader
   merges indexed chunks: a group is read when the merge reaches its first
   log time, so memory holds the groups that overlap in time (one or two in a
   file written in order), not the file.

Ties break by file position, as in mcap's readers: the result is the one the
same file with chunk indexes gives.
"""

from __future__ import annotations

import heapq
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lake_sdk.mcap._lib import require

__all__ = ["LOOSE_GROUP_BYTES", "stream_messages"]

#: Loose (unchunked) messages are read back in runs of at most about this many bytes.
LOOSE_GROUP_BYTES = 1024 * 1024


@dataclass
class _Group:
    """A chunk, or a run of loose messages: bytes ``start..end`` of the file."""

    start: int
    end: int
    first_ns: int


@dataclass
class _Index:
    """What pass 1 learnt: declarations, and the groups holding wanted messages."""

    schemas: dict[int, Any]
    channels: dict[int, Any]
    groups: list[_Group]


class _Filter:
    """The window: topics, and log time ``start_ns <= t < end_ns``."""

    def __init__(self, topics: list[str] | None, start_ns: int | None, end_ns: int | None):
        self.topics = None if topics is None else set(topics)
        self.start_ns = start_ns
        self.end_ns = end_ns

    def wants(self, channel: Any, log_time: int) -> bool:
        if self.topics is not None and channel.topic not in self.topics:
            return False
        if self.start_ns is not None and log_time < self.start_ns:
            return False
        return self.end_ns is None or log_time < self.end_ns


def stream_messages(
    stream: io.BufferedIOBase,
    topics: list[str] | None,
    start_ns: int | None,
    end_ns: int | None,
) -> Iterator[tuple[Any, Any, Any]]:
    """``(schema, channel, message)`` of the window, in log-time order (mcap's tuples)."""
    window = _Filter(topics, start_ns, end_ns)
    index = _scan(stream, window)
    yield from _merge(stream, index, window)


def _scan(stream: io.BufferedIOBase, window: _Filter) -> _Index:
    """Pass 1: every record once (CRCs checked), one chunk in memory at a time."""
    records = require("mcap.records")
    stream_reader = require("mcap.stream_reader")
    index = _Index({}, {}, [])
    loose: _Group | None = None
    stream.seek(0)
    reader = stream_reader.StreamReader(
        stream, skip_magic=False, emit_chunks=True, validate_crcs=True
    )
    position = stream.tell()
    for record in reader.records:
        start, position = position, stream.tell()
        if isinstance(record, records.Message):
            if loose is not None and position - loose.start > LOOSE_GROUP_BYTES:
                loose = None
            loose = _take(index, window, [record], start, position, loose)
            continue
        loose = None
        if isinstance(record, records.Chunk):
            inner = stream_reader.breakup_chunk(record, validate_crc=True)
            _take(index, window, inner, start, position, None)
        else:
            _declare(index, record)
    return index


def _take(
    index: _Index,
    window: _Filter,
    inner: list[Any],
    start: int,
    end: int,
    group: _Group | None,
) -> _Group | None:
    """Note the records of bytes ``start..end``; returns the loose group they extend."""
    records = require("mcap.records")
    for record in inner:
        if not isinstance(record, records.Message):
            _declare(index, record)
            continue
        channel = index.channels.get(record.channel_id)
        if channel is None:  # as mcap's linear reader: a channel is declared before use
            raise require("mcap.exceptions").McapError(
                f"no channel record found with id {record.channel_id}"
            )
        if not window.wants(channel, record.log_time):
            continue
        if group is None:
            group = _Group(start, end, record.log_time)
            index.groups.append(group)
        group.first_ns = min(group.first_ns, record.log_time)
    if group is not None:
        group.end = end
    return group


def _declare(index: _Index, record: Any) -> None:
    """Keep a schema or channel record (others carry nothing the merge needs)."""
    records = require("mcap.records")
    if isinstance(record, records.Schema):
        index.schemas[record.id] = record
    elif isinstance(record, records.Channel):
        if record.schema_id != 0 and record.schema_id not in index.schemas:
            raise require("mcap.exceptions").McapError(
                f"no schema record found with id {record.schema_id}"
            )
        index.channels[record.id] = record


def _merge(
    stream: io.BufferedIOBase, index: _Index, window: _Filter
) -> Iterator[tuple[Any, Any, Any]]:
    """Pass 2: groups read as the log-time merge reaches them (mcap's queue order)."""
    # (log time, file position, record number, payload); -1 puts a group before its messages.
    queue: list[tuple[int, int, int, Any]] = [(g.first_ns, g.start, -1, g) for g in index.groups]
    heapq.heapify(queue)
    while queue:
        _, start, number, item = heapq.heappop(queue)
        if number >= 0:
            yield item
            continue
        for place, message in _messages(stream, item):
            channel = index.channels[message.channel_id]
            if window.wants(channel, message.log_time):
                schema = index.schemas.get(channel.schema_id) if channel.schema_id else None
                heapq.heappush(queue, (message.log_time, start, place, (schema, channel, message)))


def _messages(stream: io.BufferedIOBase, group: _Group) -> Iterator[tuple[int, Any]]:
    """The messages of one group, numbered by their place among its records (CRCs checked)."""
    records = require("mcap.records")
    stream_reader = require("mcap.stream_reader")
    stream.seek(group.start)
    data = stream.read(group.end - group.start)
    if len(data) != group.end - group.start:
        raise require("mcap.exceptions").McapError("the recording changed while it was read")
    buffer = io.BytesIO(data)
    reader = stream_reader.StreamReader(
        buffer, skip_magic=True, emit_chunks=True, validate_crcs=True
    )
    number = 0
    # The group's bytes end at a record's end and hold no footer: stop there.
    for record in reader.records:
        inner = (
            stream_reader.breakup_chunk(record, validate_crc=True)
            if isinstance(record, records.Chunk)
            else [record]
        )
        for item in inner:
            if isinstance(item, records.Message):
                yield number, item
            number += 1
        if buffer.tell() == len(data):
            return
