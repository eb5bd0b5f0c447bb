"""Bulk ingest on a served Metasrv: one version per stream, nothing without the end marker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.errors import Aborted, LocationOutsideStage, SchemaMismatch, TableNotFound
from lake_core.filetype import FILE_STRUCT
from lake_core.flight.encoding import encode_stream
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_pb2 as pb
from lake_metasrv.ingest import FEED_BATCHES


def stream(
    table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], *, end: bool = True
) -> AsyncIterator[pb.FlightData]:
    command = protocol.IngestCommand(table=table, operation_id=new_operation_id())
    descriptor = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=protocol.encode(command))

    async def messages() -> AsyncIterator[pb.FlightData]:
        for raw in encode_stream(schema, batches, descriptor=descriptor.SerializeToString()):
            yield pb.FlightData.FromString(raw)
        if end:
            yield pb.FlightData(app_metadata=protocol.INGEST_END)

    return messages()


@pytest.mark.asyncio
async def test_a_stream_is_one_version_and_needs_its_end_marker(served: Any, kit: Any) -> None:
    await served.coordinator.create_table(kit.episodes, kit.schema)
    # More batches than the feed holds, and more rows than an append may carry.
    batches = [kit.make_batch(2_000, i * 2_000) for i in range(4 * FEED_BATCHES)]
    async with MetaClient(served.addr) as client:
        with pytest.raises(Aborted):
            await client.ingest_messages(stream(kit.episodes, kit.schema, batches, end=False))
        assert (await client.describe_table(kit.episodes)).entry.descriptor.version == 0
        result = await client.ingest_messages(stream(kit.episodes, kit.schema, batches))
        assert (result.version, result.rows) == (1, 32_000)
    record = await served.coordinator.describe_table(kit.episodes)
    table = await served.coordinator.engine.read(record.location, record.engine_version)
    assert table.num_rows == 32_000
    assert sorted(table["episode_id"].to_pylist()) == sorted(f"ep-{i}" for i in range(32_000))


@pytest.mark.asyncio
async def test_refusals_leave_no_version(served: Any, kit: Any) -> None:
    await served.coordinator.create_table(kit.episodes, kit.schema)
    videos = TableRef("robots", "videos")
    await served.coordinator.create_table(videos, kit.file_schema)
    outside = pa.record_batch(
        [
            pa.array(["ep-0"]),
            pa.array(
                [
                    {
                        "uri": "file:///elsewhere/v.mp4",
                        "media_type": "video/mp4",
                        "size_bytes": 1,
                        "sha256": "ab" * 32,
                    }
                ],
                FILE_STRUCT,
            ),
        ],
        schema=kit.file_schema,
    )
    wrong = pa.schema([pa.field("episode_id", pa.utf8())])
    async with MetaClient(served.addr) as client:
        with pytest.raises(SchemaMismatch):
            await client.ingest_messages(
                stream(kit.episodes, wrong, [pa.record_batch([pa.array(["x"])], schema=wrong)])
            )
        missing = TableRef("robots", "missing")
        with pytest.raises(TableNotFound):
            await client.ingest_messages(stream(missing, kit.schema, [kit.make_batch(1)]))
        # A bad FILE cell after good batches: the written fragments stay orphans.
        good = [kit.make_batch(5, i * 5, kit.file_schema) for i in range(FEED_BATCHES * 2)]
        with pytest.raises(LocationOutsideStage):
            await client.ingest_messages(stream(videos, kit.file_schema, [*good, outside]))
        assert (await client.describe_table(kit.episodes)).entry.descriptor.version == 0
        assert (await client.describe_table(videos)).entry.descriptor.version == 0
        done = await client.ingest_messages(stream(videos, kit.file_schema, good))
        assert (done.version, done.rows) == (1, 40)
