"""One topic of every selected recording as rows of a table, with typed Arrow columns.

Columns: ``recording_sha256`` (the recording's key: its FILE's SHA-256),
``log_time`` (timestamp, ns, UTC) and the message's fields, typed from the
ROS 2 message definition or JSON schema in the file
(:mod:`lake_sdk.mcap.types`). The table is created (through Metasrv) on
first use. Each recording's rows are ONE table version, however many there
are: they are decoded in batches of at most :data:`BATCH_ROWS` rows and
:data:`BATCH_BYTES` of messages and streamed through bulk ingest
(``client.ingest``), which commits the stream once or not at all, so memory is
bounded by a batch, not by the recording. A recording whose key is already
in the table is skipped, so extracting again never duplicates rows. Messages
are read through ``open_file`` range reads, only the chunks that hold the
topic.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lake_core.errors import InvalidArgument, NotFound
from lake_core.filetype import row_to_location
from lake_core.metaclient import MetaClient
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap.read import Message, Messages, check_location
from lake_sdk.mcap.types import arrow_type, conform

if TYPE_CHECKING:
    from lake_sdk._client import AsyncClient

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "Extracted", "extract_topic"]

TIME = pa.timestamp("ns", tz="UTC")
#: Most rows decoded into one batch: with :data:`BATCH_BYTES`, what extraction holds at once.
BATCH_ROWS = 4096
#: Most message bytes (as recorded) decoded into one batch: a camera topic reaches this first.
BATCH_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Extracted:
    table: TableRef
    recordings: int
    skipped: int
    rows: int
    versions: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "table": str(self.table),
            "recordings": self.recordings,
            "skipped": self.skipped,
            "rows": self.rows,
            "versions": list(self.versions),
        }


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


async def extract_topic(
    client: AsyncClient,
    recordings: TableRef | str,
    topic: str,
    into: TableRef | str,
    *,
    meta: MetaClient,
    where: str | None = None,
) -> Extracted:
    """Decode ``topic`` of each recording ``where`` selects into ``into``; see the module docs."""
    source = recordings if isinstance(recordings, TableRef) else TableRef.parse(recordings)
    target = into if isinstance(into, TableRef) else TableRef.parse(into)
    if not isinstance(topic, str) or not topic:
        raise InvalidArgument("--topic names one topic, such as /joint_states")
    sql = f"SELECT recording FROM {source}" + (f" WHERE {where}" if where else "")
    selected = await client.query_table(sql)
    try:
        schema: pa.Schema | None = await client.table_schema(target)
    except NotFound:
        schema = None
    skipped = rows = 0
    versions: list[int] = []
    for cell in selected.column("recording").to_pylist():
        if cell is None:
            continue
        location = check_location(row_to_location(cell))
        if schema is not None:
            seen = await client.query_table(
                f"SELECT count(*) AS n FROM {target} WHERE recording_sha256 = "
                f"{_quoted(location.sha256)}"
            )
            if seen["n"][0].as_py():
                skipped += 1
                continue
        else:
            wanted = await _checked_schema(client, location, topic)
            if wanted is None:
                continue
            await meta.create_table(target, wanted)
            schema = await client.table_schema(target)
        done = await _ingest(client, location, topic, target, schema)
        if done is not None:
            versions.append(done[0])
            rows += done[1]
    return Extracted(target, selected.num_rows, skipped, rows, tuple(versions))


async def _checked_schema(
    client: AsyncClient, location: DataLocation, topic: str
) -> pa.Schema | None:
    """The table the recording's topic makes, once every row is known to fit it; None if empty.

    A pass of its own, batch by batch, before the table exists: the table is
    created only for a recording that can be extracted, so a refused first
    recording leaves no empty table behind.
    """
    batches = _Batches(await _messages(client, location, topic), location, topic, None)
    try:
        first = await asyncio.to_thread(next, iter(batches), None)
        if first is None:
            return None
        await asyncio.to_thread(_drain, batches)
    finally:
        await asyncio.to_thread(batches.close)
    return first.schema


def _drain(batches: _Batches) -> None:
    """Decode the rest, holding one batch at a time: the check of :func:`_checked_schema`."""
    for _ in batches:
        pass


async def _ingest(
    client: AsyncClient, location: DataLocation, topic: str, target: TableRef, schema: pa.Schema
) -> tuple[int, int] | None:
    """Stream the recording's rows into ``target`` as one version: ``(version, rows)``.

    None if the topic has no messages (nothing is committed then). A failure
    while decoding (a corrupt chunk after rows were sent) aborts the ingest:
    nothing of the recording is committed, and the decoding error is raised.
    """
    batches = _Batches(await _messages(client, location, topic), location, topic, schema)
    stream = iter(batches)
    try:
        first = await asyncio.to_thread(next, stream, None)
        if first is None:
            return None
        reader = pa.RecordBatchReader.from_batches(schema, itertools.chain([first], stream))
        version = await client.ingest(target, reader)
    finally:
        await asyncio.to_thread(batches.close)
    return version, batches.rows


async def _messages(client: AsyncClient, location: DataLocation, topic: str) -> Messages:
    file = await client.open_file(location, block_size=64 * 1024, read_ahead=0)
    return Messages(file, [topic], None, None)


class _Batches:
    """One recording's topic as batches of the table's rows, decoded as they are read.

    Iterate it once, off the event loop (its file blocks). ``schema``: the
    table's; None before the table exists (the recording's own then).
    ``rows`` counts the rows handed out so far.
    """

    def __init__(
        self, messages: Messages, location: DataLocation, topic: str, schema: pa.Schema | None
    ) -> None:
        self._messages = messages
        self._key = location.sha256
        self._uri = location.uri
        self._topic = topic
        self._schema = schema
        self._batches: Generator[pa.RecordBatch] = self._read()
        self.rows = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self._batches

    def close(self) -> None:
        """Stop reading: closes the generator, and with it the recording's file."""
        self._batches.close()
        self._messages.close()

    def _read(self) -> Generator[pa.RecordBatch]:
        kind: pa.StructType | None = None
        values: list[dict[str, Any]] = []
        size = 0
        for message in self._messages:
            if kind is None:
                kind = arrow_type(message.schema_name, message.schema_encoding, message.schema_data)
                if self._schema is None:
                    self._schema = _table_schema(kind)
            values.append(_row(message, self._key, kind))
            size += len(message.data)
            if len(values) >= BATCH_ROWS or size >= BATCH_BYTES:
                yield self._batch(values)
                values, size = [], 0
        if values:
            yield self._batch(values)

    def _batch(self, values: list[dict[str, Any]]) -> pa.RecordBatch:
        """The rows as a batch of the table; a value its column cannot hold is the recording's."""
        try:
            batch = pa.RecordBatch.from_pylist(values, schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise InvalidRecording(
                f"messages on {self._topic} in {self._uri} do not fit their schema's columns: "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            ) from None
        self.rows += batch.num_rows
        return batch


def _table_schema(kind: pa.StructType) -> pa.Schema:
    return pa.schema([pa.field("recording_sha256", pa.utf8()), pa.field("log_time", TIME), *kind])


def _row(message: Message, key: str, kind: pa.StructType) -> dict[str, Any]:
    """One message as a row; a message that is not an object of its schema is refused."""
    decoded = conform(message.decoded, kind)
    if decoded is None:
        raise InvalidRecording(
            f"the message on {message.topic} at log time {message.log_time_ns} is not an object "
            f"of its schema {message.schema_name!r}"
        )
    return {"recording_sha256": key, "log_time": message.log_time_ns, **decoded}
