"""Recordings tables: one row per MCAP recording, the file itself a FILE value.

A recordings table has the standard columns below plus the user's own::

    recording      FILE     the MCAP file (uploaded directly, resumably, verified)
    name           utf8     the file's base name when it was added
    start_time     timestamp[ns, UTC]   first message's log time (null: no messages)
    end_time       timestamp[ns, UTC]   last message's log time
    duration_s     float64  end - start in seconds
    message_count  int64
    topics         list<struct<topic, schema_name, message_encoding, message_count>>

:func:`add_recording` reads the file's summary (or, without one, counts it in
one streaming pass, chunk CRCs checked) BEFORE uploading: a file that is not
a complete MCAP file raises :class:`~lake_sdk.errors.InvalidRecording` and
nothing is uploaded or appended. The chunks of a file with a summary are
checked only when a window reads them. Then the file is uploaded (resumable with an
``upload_checkpoint_dir``) and one row appended as one table version.
Needs the SDK's ``mcap`` extra (``mcap`` and ``mcap-ros2-support``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_core.filetype import file_field
from lake_core.names import TableRef, validate_identifier
from lake_core.schemas import parse_column_spec, validate_table_schema
from lake_objects.progress import ProgressCallback
from lake_objects.source import FileUpload
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap.summary import RecordingSummary, summarize

if TYPE_CHECKING:
    from lake_sdk._client import AsyncClient

__all__ = [
    "MEDIA_TYPE",
    "STANDARD_COLUMNS",
    "TOPIC_STRUCT",
    "AddedRecording",
    "add_recording",
    "read_summary",
    "recordings_schema",
]

#: The media type recordings are stored with.
MEDIA_TYPE = "application/x-mcap"

TOPIC_STRUCT = pa.struct(
    [
        pa.field("topic", pa.utf8()),
        pa.field("schema_name", pa.utf8()),
        pa.field("message_encoding", pa.utf8()),
        pa.field("message_count", pa.int64()),
    ]
)
TIME = pa.timestamp("ns", tz="UTC")
STANDARD_FIELDS: tuple[pa.Field, ...] = (
    file_field("recording"),
    pa.field("name", pa.utf8()),
    pa.field("start_time", TIME),
    pa.field("end_time", TIME),
    pa.field("duration_s", pa.float64()),
    pa.field("message_count", pa.int64()),
    pa.field("topics", pa.list_(TOPIC_STRUCT)),
)
STANDARD_COLUMNS = tuple(f.name for f in STANDARD_FIELDS)


@dataclass(frozen=True)
class AddedRecording:
    """What :func:`add_recording` appended: the table version and the recording's summary."""

    table: TableRef
    version: int
    name: str
    summary: RecordingSummary

    def as_json(self) -> dict[str, Any]:
        return {
            "table": str(self.table),
            "version": self.version,
            "name": self.name,
            **self.summary.as_json(),
        }


def recordings_schema(columns: Sequence[str | pa.Field] = ()) -> pa.Schema:
    """The standard columns plus the user's (``name:type`` specs or Arrow fields)."""
    fields = list(STANDARD_FIELDS)
    for column in columns:
        extra = parse_column_spec(column) if isinstance(column, str) else column
        if not isinstance(extra, pa.Field):
            raise InvalidArgument("a recordings column is 'name:type' or a pyarrow.Field")
        if extra.name in STANDARD_COLUMNS:
            raise InvalidArgument(f"{extra.name!r} is a standard recordings column")
        fields.append(extra)
    return validate_table_schema(pa.schema(fields))


def check_recordings_schema(table: TableRef, schema: pa.Schema) -> None:
    """Refuse a table that lacks a standard column or has it with another type."""
    for expected in STANDARD_FIELDS:
        index = schema.get_field_index(expected.name)
        if index < 0:
            raise InvalidArgument(
                f"{table} is not a recordings table: it has no {expected.name!r} column "
                "(create it with `lake recordings create-table`)"
            )
        if schema.field(index).type != expected.type:
            raise InvalidArgument(
                f"{table} is not a recordings table: {expected.name!r} is "
                f"{schema.field(index).type}, not {expected.type}"
            )


def read_summary(path: str | os.PathLike[str]) -> RecordingSummary:
    """The summary of a local MCAP file (InvalidRecording if it is not a complete one)."""
    source = Path(path)
    if not source.is_file():
        raise InvalidArgument(f"{source} is not a regular file")
    with source.open("rb") as stream:
        return summarize(stream, source.name)


#: The latest log time a timestamp[ns] column holds (2262-04-11): MCAP's are uint64.
MAX_LOG_TIME_NS = 2**63 - 1


def _check_storable(summary: RecordingSummary, name: str) -> None:
    """Refuse a recording whose log times its row cannot hold, naming them (not a column)."""
    if summary.end_ns is not None and summary.end_ns > MAX_LOG_TIME_NS:
        raise InvalidRecording(
            f"{name} has log times up to {summary.end_ns} ns, past what a recordings table "
            f"holds ({MAX_LOG_TIME_NS} ns, 2262-04-11)"
        )


def _values(values: Mapping[str, Any] | None) -> dict[str, Any]:
    out = dict(values or {})
    for name in out:
        validate_identifier(name, "column name")
        if name in STANDARD_COLUMNS:
            raise InvalidArgument(f"{name!r} is set by add_recording itself")
    return out


async def add_recording(
    client: AsyncClient,
    table: TableRef | str,
    path: str | os.PathLike[str],
    *,
    values: Mapping[str, Any] | None = None,
    progress: ProgressCallback | bool | None = None,
) -> AddedRecording:
    """Check and summarize ``path``, upload it, append one row; see the module docs."""
    ref = table if isinstance(table, TableRef) else TableRef.parse(table)
    extra = _values(values)
    source = Path(path)
    schema = await client.table_schema(ref)
    check_recordings_schema(ref, schema)
    summary = await asyncio.to_thread(read_summary, source)
    _check_storable(summary, source.name)
    row: dict[str, Any] = {
        "recording": FileUpload.from_path(source, MEDIA_TYPE),
        "name": source.name,
        "start_time": summary.start_ns,
        "end_time": summary.end_ns,
        "duration_s": summary.duration_s,
        "message_count": summary.message_count,
        "topics": [t.as_row() for t in summary.topics],
        **extra,
    }
    columns = list(row)
    sql = f"INSERT INTO {ref} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    # insert validates every value against the table before the upload starts.
    version = await client.insert(sql, [row[c] for c in columns], progress=progress)
    return AddedRecording(ref, version, source.name, summary)
