"""Durable pending appends: a crash between upload and append is recovered exactly once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core.errors import LakeError, NotFound, OperationExpired
from lake_core.names import TableRef
from lake_sdk import LakeClient
from lake_sdk._pending import PendingAppendStore
from tests.files.conftest import EPISODES, sdk_env, write_random
from tools.lake_testing.data import describe_version
from tools.lake_testing.faults import fault_env
from tools.lake_testing.plugin import LakeCluster

pytestmark = [pytest.mark.asyncio]

CHILD = """
import asyncio, sys
from lake_sdk import FileUpload, LakeClient

async def main(url, path, checkpoints):
    async with await LakeClient.connect(url, upload_checkpoint_dir=checkpoints) as client:
        await client.insert(
            "INSERT INTO robots.episodes (episode_id, video) VALUES (?, ?)",
            ["ep-crash", FileUpload.from_path(path, "video/mp4")],
        )

asyncio.run(main(*sys.argv[1:4]))
"""


def _crash(cluster: LakeCluster, source: Path, checkpoints: Path, point: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, cluster.query.url, str(source), str(checkpoints)],
        env=sdk_env(fault_env(f"sdk.{point}", base=os.environ)),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 137, done.stderr.decode()[-3000:]


async def _rows(client: LakeClient) -> list[str]:
    table = await client.query_table("SELECT episode_id FROM robots.episodes")
    return sorted(table.column("episode_id").to_pylist())


@pytest.mark.parametrize("point", ["after_pending_write", "after_append_commit"])
async def test_crash_between_upload_and_append_resumes_exactly_once(
    local_lake: LakeCluster, tmp_path: Path, point: str
) -> None:
    source = write_random(tmp_path / "ep.mp4", 300_000)
    checkpoints = tmp_path / "checkpoints"
    await asyncio.to_thread(_crash, local_lake, source, checkpoints, point)
    committed_before = point == "after_append_commit"
    async with await LakeClient.connect(
        local_lake.query.url, upload_checkpoint_dir=checkpoints
    ) as client:
        [operation_id] = await client.pending_append_ids()
        assert await _rows(client) == (["ep-crash"] if committed_before else [])
        version = await client.resume_pending_append(operation_id)
        assert version == 1
        assert await _rows(client) == ["ep-crash"]
        assert await client.pending_append_ids() == []
        with pytest.raises(NotFound):
            await client.resume_pending_append(operation_id)
    # The pending file held metadata only: far smaller than the uploaded object.
    assert await asyncio.to_thread(describe_version, local_lake.meta.addr, EPISODES) == 1


async def test_ambiguous_failure_keeps_the_pending_append(
    local_lake: LakeCluster, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    async with await LakeClient.connect(
        local_lake.query.url, upload_checkpoint_dir=checkpoints, append_attempts=1
    ) as client:
        schema = await client.table_schema(EPISODES)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(["ep-9"]), pa.nulls(1, schema.field("video").type)], schema=schema
        )
        await asyncio.to_thread(local_lake.query.stop)
        with pytest.raises(LakeError) as raised:
            await client.append_batches(EPISODES, [batch])
        operation_id = raised.value.operation_id  # type: ignore[attr-defined]
        assert await client.pending_append_ids() == [operation_id]
    await asyncio.to_thread(local_lake.query.start)
    async with await LakeClient.connect(
        local_lake.query.url, upload_checkpoint_dir=checkpoints
    ) as client:
        assert await client.resume_pending_append(operation_id) == 1
        assert await _rows(client) == ["ep-9"]
        assert await client.pending_append_ids() == []


def _old_operation_id(days: int) -> str:
    ms = int((time.time() - days * 86400) * 1000)
    value = (ms << 80) | (0x7 << 76) | (0b10 << 62) | (uuid.uuid4().int & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


async def test_expired_and_rejected_operations_are_conclusive(
    local_lake: LakeCluster, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    store = PendingAppendStore(checkpoints)
    schema = pa.schema([pa.field("episode_id", pa.utf8())])
    batch = pa.RecordBatch.from_pydict({"episode_id": ["x"]}, schema=schema)
    expired = _old_operation_id(8)
    store.write(expired, EPISODES, schema, [batch])
    missing = _old_operation_id(0)
    store.write(missing, TableRef("robots", "gone"), schema, [batch])
    async with await LakeClient.connect(
        local_lake.query.url, upload_checkpoint_dir=checkpoints
    ) as client:
        assert await client.pending_append_ids() == sorted([expired, missing])
        with pytest.raises(OperationExpired):  # past the 7-day retention horizon
            await client.resume_pending_append(expired)
        with pytest.raises(NotFound):
            await client.resume_pending_append(missing)
        assert await client.pending_append_ids() == []
