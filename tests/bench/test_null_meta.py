"""The transport-ceiling Metasrv checks every append as Metasrv does, answers it, and keeps nothing."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.errors import SchemaMismatch
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tools.bench.commit_bench import rows_batch, start_null_meta
from tools.bench.commit_floor import SCHEMA

T = TableRef("bench", "ceiling")


def _append() -> protocol.AppendCommand:
    return protocol.AppendCommand(table=T, operation_id=new_operation_id())


@pytest.mark.asyncio
async def test_checked_appends_are_answered_and_nothing_is_committed(tmp_path: Path) -> None:
    meta = start_null_meta(tmp_path / "data", tmp_path)
    try:
        async with MetaClient(f"http://{meta.addr}") as client:
            created = await client.create_table(T, SCHEMA)
            answered = await client.append(_append(), SCHEMA, [rows_batch(0, 10)])
            assert answered.version == 1  # the version it would have become
            # The checks still run: another schema is refused exactly as Metasrv refuses it.
            other = pa.schema([("id", pa.int64())])
            with pytest.raises(SchemaMismatch):
                await client.append(_append(), other, [pa.record_batch([[1]], schema=other)])
            described = await client.describe_table(T)
        assert described.entry.descriptor.version == 0
    finally:
        meta.stop()
    assert meta.proc is not None
    assert meta.proc.poll() is not None  # stopped by its pid
    dataset = lance.dataset(created.entry.descriptor.location)
    assert dataset.count_rows() == 0
