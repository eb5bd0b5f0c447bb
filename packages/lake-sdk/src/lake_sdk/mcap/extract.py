"""One topic of every selected recording as rows of a table, with typed Arrow columns.

Columns: ``recording_sha256`` (the recording's key: its FILE's SHA-256),
``log_time`` (timestamp, ns, UTC) and the message's fields, typed from the
ROS 2 message definition or JSON schema in the file
(:mod:`lake_sdk.mcap.types`). The table is created (through Metasrv) on
first use. Each recording's rows are appended as one table version; a
recording whose key is already in the table is skipped, so extracting again
never duplicates rows. Messages are read through ``open_file`` range reads,
only the chunks that hold the topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lake_core.errors import InvalidArgument, NotFound
from lake_core.filetype import row_to_location
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.protocol import MAX_APPEND_ROWS
from lake_sdk.errors import InvalidRecording
from lake_sdk.mcap.read import AsyncMessages, Message, Messages, check_location
from lake_sdk.mcap.types import arrow_type, conform

if TYPE_CHECKING:
    from lake_sdk._client import AsyncClient

__all__ = ["Extracted", "extract_topic"]

TIME = pa.timestamp("ns", tz="UTC")


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
        key = location.sha256
        if schema is not None:
            seen = await client.query_table(
                f"SELECT count(*) AS n FROM {target} WHERE recording_sha256 = {_quoted(key)}"
            )
            if seen["n"][0].as_py():
                skipped += 1
                continue
        file = await client.open_file(location, block_size=64 * 1024, read_ahead=0)
        window = AsyncMessages(Messages(file, [topic], None, None))
        kind: pa.StructType | None = None
        values: list[dict[str, Any]] = []
        async for message in window:
            if kind is None:
                kind = arrow_type(message.schema_name, message.schema_encoding, message.schema_data)
            values.append(_row(message, key, kind))
        if kind is None:
            continue
        # The table is created only once a recording's rows are known to fit it.
        wanted = schema if schema is not None else _table_schema(kind)
        batches = _batches(values, wanted, topic, location.uri)
        if schema is None:
            await meta.create_table(target, wanted)
            schema = await client.table_schema(target)
        versions.append(await client.append_batches(target, batches))
        rows += len(values)
    return Extracted(target, selected.num_rows, skipped, rows, tuple(versions))


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


def _batches(
    values: list[dict[str, Any]], schema: pa.Schema, topic: str, uri: str
) -> list[pa.RecordBatch]:
    """The rows as batches of the table; a value its column cannot hold is the recording's fault."""
    try:
        return [
            pa.RecordBatch.from_pylist(values[i : i + MAX_APPEND_ROWS], schema=schema)
            for i in range(0, len(values), MAX_APPEND_ROWS)
        ]
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise InvalidRecording(
            f"messages on {topic} in {uri} do not fit their schema's columns: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
