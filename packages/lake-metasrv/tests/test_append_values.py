"""Metasrv refuses appended values that would change meaning in the column type.

Clients other than Lake's SDK (pyarrow's Flight client here, as any program
could) may send a numeric column of another type; a value that the table's
type would truncate, wrap or overflow is InvalidAppend naming row and column,
and nothing is written.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from lake_core import protocol
from lake_core.errors import InvalidAppend, SchemaMismatch
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.schemas import schema_to_base64

TABLE = TableRef("robots", "values")
SCHEMA = pa.schema([("n", pa.int64()), ("x", pa.float32())])


def _create(url: str) -> None:
    body = {"table": TABLE.model_dump(), "schema_ipc": schema_to_base64(SCHEMA)}
    with fl.FlightClient(url) as client:
        list(client.do_action(fl.Action(protocol.CREATE_TABLE, json.dumps(body).encode())))


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("n", "x", "column", "why"),
    [
        (pa.array([1.0, 1.5]), pa.array([0.0, 0.0], pa.float32()), "n", "fractional"),
        (pa.array([1, 2], pa.int64()), pa.array([0.1, 1e39]), "x", "overflows"),
        (pa.array([1, 2**64 - 1], pa.uint64()), pa.array([0.0, 0.0], pa.float32()), "n", "range"),
    ],
)
async def test_a_value_changing_column_is_invalid_append(
    served: Any, n: pa.Array, x: pa.Array, column: str, why: str
) -> None:
    await asyncio.to_thread(_create, served.url)
    batch = pa.record_batch([n, x], names=["n", "x"])
    command = protocol.AppendCommand(table=TABLE, operation_id=new_operation_id())
    async with MetaClient(f"http://{served.addr}") as client:
        with pytest.raises(InvalidAppend, match=f"row 1, column '{column}' of robots.values"):
            await client.append(command, batch.schema, [batch])
        # The same types with harmless values are still a schema mismatch.
        fine = pa.record_batch([n.slice(0, 1), x.slice(0, 1)], names=["n", "x"])
        command = protocol.AppendCommand(table=TABLE, operation_id=new_operation_id())
        with pytest.raises(SchemaMismatch):
            await client.append(command, fine.schema, [fine])
    record = await served.coordinator.describe_table(TABLE)
    assert record.version == 0
