"""What a recording holds, read from its summary or, without one, from one streaming pass.

An MCAP file written with the default writer ends with a summary section
(statistics, channels, schemas, chunk indexes) that a seekable reader finds
from the footer: reading it costs a few kilobytes whatever the file's size.
A file without a summary (or statistics) is counted by one pass over its
records, chunk by chunk, with CRCs checked, so memory stays bounded by one
chunk. Anything that is not a complete MCAP file raises
:class:`~lake_sdk.errors.InvalidRecording`.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, Any

from lake_core.errors import LakeError
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap._lib import require

__all__ = [
    "FOOTER_BYTES",
    "FOOTER_OPCODE",
    "MAGIC",
    "RecordingSummary",
    "TopicSummary",
    "check_magic",
    "check_summary_crc",
    "summarize",
]

#: Every MCAP file starts and ends with these 8 bytes.
MAGIC = b"\x89MCAP0\r\n"
#: The footer record: opcode, length, summary start, summary offset start, CRC.
FOOTER_BYTES = 1 + 8 + 8 + 8 + 4
FOOTER_OPCODE = 0x02


@dataclass(frozen=True)
class TopicSummary:
    """One topic of a recording: its schema, encoding and how many messages it has."""

    topic: str
    schema_name: str
    message_encoding: str
    message_count: int

    def as_row(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "schema_name": self.schema_name,
            "message_encoding": self.message_encoding,
            "message_count": self.message_count,
        }


@dataclass(frozen=True)
class RecordingSummary:
    """A recording's time span (log time, ns), message count and topics.

    ``start_ns``/``end_ns`` are None for a recording without messages;
    ``from_summary`` says whether the file's own summary gave the figures
    (False: one streaming pass counted them).
    """

    start_ns: int | None
    end_ns: int | None
    message_count: int
    topics: tuple[TopicSummary, ...]
    from_summary: bool

    @property
    def duration_s(self) -> float:
        if self.start_ns is None or self.end_ns is None:
            return 0.0
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def start_time(self) -> datetime | None:
        return None if self.start_ns is None else _as_datetime(self.start_ns)

    @property
    def end_time(self) -> datetime | None:
        return None if self.end_ns is None else _as_datetime(self.end_ns)

    def as_json(self) -> dict[str, Any]:
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_s": self.duration_s,
            "message_count": self.message_count,
            "topics": [t.as_row() for t in self.topics],
            "from_summary": self.from_summary,
        }


def _as_datetime(ns: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000)


def check_magic(head: bytes, name: str) -> None:
    """Refuse a file that does not start with MCAP's magic (before anything is uploaded)."""
    if head[: len(MAGIC)] != MAGIC:
        raise InvalidRecording(f"{name} is not an MCAP file (its first bytes are not MCAP's magic)")


#: A seekable binary stream: a local file or a (tailed) ObjectFile.
Stream = IO[bytes] | io.BufferedIOBase


def check_summary_crc(stream: Stream, name: str) -> None:
    """Refuse a summary whose bytes do not match the footer's CRC (0: the writer gave none).

    mcap's reader does not check it, and a damaged chunk index makes a window
    read skip messages, or damaged statistics give a wrong row, silently.
    The CRC covers the summary and the footer's fields before it.
    """
    size = stream.seek(0, io.SEEK_END)
    if size < 2 * len(MAGIC) + FOOTER_BYTES:
        return  # too short to have a footer: the readers say how
    end = size - len(MAGIC) - 4
    stream.seek(end - (FOOTER_BYTES - 4))
    footer = stream.read(FOOTER_BYTES)
    if footer[0] != FOOTER_OPCODE:
        return
    summary_start, _, crc = struct.unpack_from("<QQI", footer, 9)
    if summary_start == 0 or crc == 0:
        return
    if not len(MAGIC) <= summary_start < end:
        raise InvalidRecording(f"{name}'s footer points its summary outside the file")
    stream.seek(summary_start)
    if zlib.crc32(stream.read(end - summary_start)) != crc:
        raise InvalidRecording(f"{name}'s summary is corrupt: it does not match its CRC")


def summarize(stream: Stream, name: str) -> RecordingSummary:
    """The summary of the MCAP file ``stream`` (seekable, positioned anywhere)."""
    stream.seek(0)
    check_magic(stream.read(len(MAGIC)), name)
    summary = _from_summary(stream, name)
    if summary is not None:
        return summary
    stream.seek(0)
    return _from_stream(stream, name)


def _from_summary(stream: Stream, name: str) -> RecordingSummary | None:
    """The figures of the file's own summary, or None if it has none (or none readable)."""
    reader_module = require("mcap.reader")
    size = stream.seek(0, io.SEEK_END)
    if size < 2 * len(MAGIC):
        return None
    stream.seek(size - len(MAGIC))
    if stream.read(len(MAGIC)) != MAGIC:
        return None  # truncated: the streaming pass says how
    check_summary_crc(stream, name)
    stream.seek(0)
    try:
        summary = reader_module.make_reader(stream).get_summary()
    except LakeError:
        raise  # a storage fault, not a damaged summary
    except Exception:  # a damaged summary: fall back to counting
        return None
    if summary is None or summary.statistics is None:
        return None
    stats = summary.statistics
    counts: dict[int, int] = dict(stats.channel_message_counts)
    if sum(counts.values()) != stats.message_count:
        return None  # a writer that did not count per channel
    schemas = {s.id: s.name for s in summary.schemas.values()}
    channels = [
        (c.topic, schemas.get(c.schema_id, ""), c.message_encoding, counts.get(c.id, 0))
        for c in summary.channels.values()
    ]
    empty = stats.message_count == 0
    return RecordingSummary(
        None if empty else stats.message_start_time,
        None if empty else stats.message_end_time,
        stats.message_count,
        _topics(channels),
        True,
    )


def _from_stream(stream: Stream, name: str) -> RecordingSummary:
    """Count every message in one pass (chunk CRCs checked); the file must end properly."""
    stream_reader = require("mcap.stream_reader")
    records = require("mcap.records")
    schemas: dict[int, str] = {}
    channels: dict[int, tuple[str, int, str]] = {}
    counts: dict[int, int] = {}
    start: int | None = None
    end: int | None = None
    total = 0
    footer = False
    try:
        reader = stream_reader.StreamReader(stream, skip_magic=False, validate_crcs=True)
        for record in reader.records:
            if isinstance(record, records.Message):
                total += 1
                counts[record.channel_id] = counts.get(record.channel_id, 0) + 1
                t = record.log_time
                start = t if start is None or t < start else start
                end = t if end is None or t > end else end
            elif isinstance(record, records.Channel):
                channels[record.id] = (record.topic, record.schema_id, record.message_encoding)
            elif isinstance(record, records.Schema):
                schemas[record.id] = record.name
            elif isinstance(record, records.Footer):
                footer = True
    except LakeError:
        raise  # InvalidRecording, or a storage fault (HashMismatch...): not the file's format
    except Exception as exc:  # mcap's own errors, struct.error, decompression errors
        raise InvalidRecording(
            f"{name} is not a readable MCAP file: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if not footer:
        raise InvalidRecording(f"{name} is truncated: it has no MCAP footer")
    unknown = set(counts) - set(channels)
    if unknown:
        raise InvalidRecording(f"{name} has messages on undeclared channels {sorted(unknown)}")
    rows = [
        (topic, schemas.get(schema_id, ""), encoding, counts.get(cid, 0))
        for cid, (topic, schema_id, encoding) in channels.items()
    ]
    return RecordingSummary(start, end, total, _topics(rows), False)


def _topics(channels: Iterable[tuple[str, str, str, int]]) -> tuple[TopicSummary, ...]:
    """One entry per (topic, schema, encoding), sorted by topic; channels of one add up."""
    merged: dict[tuple[str, str, str], int] = {}
    for topic, schema, encoding, count in channels:
        key = (topic, schema, encoding)
        merged[key] = merged.get(key, 0) + count
    return tuple(TopicSummary(t, s, e, n) for (t, s, e), n in sorted(merged.items()))
