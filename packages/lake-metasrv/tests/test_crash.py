"""Real ``python -m lake_metasrv`` processes killed mid-commit, then restarted.

After every crash: each acknowledged append is there exactly once, Lake
versions have no gaps, and retrying an operation id whose reply was lost
gives exactly one version.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
import pytest_asyncio

from lake_core import protocol
from lake_core.errors import LakeError
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_metasrv.registry import SqliteRegistry
from tools.lake_testing.faults import fault_env
from tools.lake_testing.servers import LakeProcess, start_meta

pytestmark = pytest.mark.slow

TABLE = TableRef("robots", "episodes")
SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), pa.field("step", pa.int64())])


def rows_for(op: str, n: int) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([f"{op}/{i}" for i in range(n)]), pa.array(list(range(n)), pa.int64())],
        schema=SCHEMA,
    )


@contextlib.contextmanager
def running(process: LakeProcess) -> Iterator[LakeProcess]:
    try:
        yield process
    finally:
        process.stop()


@pytest_asyncio.fixture
async def client_factory() -> AsyncIterator[Any]:
    clients: list[MetaClient] = []

    def make(process: LakeProcess) -> MetaClient:
        client = MetaClient(process.url, timeout_s=20)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


async def append(client: MetaClient, op: str, batch: pa.RecordBatch) -> protocol.AppendResult:
    command = protocol.AppendCommand(table=TABLE, operation_id=op)
    return await client.append(command, SCHEMA, [batch])


async def verify(data_dir: Path, expected: dict[str, int]) -> dict[str, int]:
    """Check the nothing-lost invariants from outside the server; return op -> version."""
    registry = SqliteRegistry(data_dir / "registry.sqlite3")
    await registry.open()
    try:
        record = await registry.get_table(TABLE)
        assert record is not None
        history = await registry.versions(record.incarnation)
        assert [v.version for v in history] == list(range(record.version + 1)), "version gap"
        assert history[-1].engine_version == record.engine_version
        ops = [v.operation_id for v in history[1:]]
        assert len(set(ops)) == len(ops), "an operation committed twice"
        assert set(ops) == set(expected), "committed operations differ from acknowledged ones"
        previous: set[str] = set()
        for v in history:
            ids = set(
                lance.dataset(record.location, version=v.engine_version)
                .to_table()
                .column("episode_id")
                .to_pylist()
            )
            added = ids - previous
            assert previous <= ids, f"version {v.version} lost rows"
            if v.version == 0:
                assert ids == set()
            else:
                op = v.operation_id
                assert op is not None
                assert added == {f"{op}/{i}" for i in range(expected[op])}, f"v{v.version}"
            previous = ids
        return {v.operation_id: v.version for v in history[1:] if v.operation_id}
    finally:
        await registry.close()


@pytest.mark.asyncio
async def test_sigkill_during_append_stream(tmp_path: Path, client_factory: Any) -> None:
    data_dir = tmp_path / "data"
    env = {"LAKE_LANCE_RETAIN_VERSIONS": "10000"}
    meta = start_meta(data_dir, tmp_path, env=env)
    with running(meta):
        client = client_factory(meta)
        await client.create_table(TABLE, SCHEMA)

        acked: dict[str, int] = {}
        sizes: dict[str, int] = {}
        unknown: list[str] = []
        enough = asyncio.Event()

        async def writer(worker: int) -> None:
            for i in range(1_000):
                op = new_operation_id()
                sizes[op] = 1 + (i + worker) % 4
                try:
                    result = await append(client, op, rows_for(op, sizes[op]))
                except LakeError:
                    unknown.append(op)
                    return
                assert op not in acked
                acked[op] = result.version
                if len(acked) >= 20:
                    enough.set()

        writers = [asyncio.create_task(writer(w)) for w in range(3)]
        await asyncio.wait_for(enough.wait(), 120)
        # Land the kill at an arbitrary step of whichever commits are in flight.
        await asyncio.sleep(random.uniform(0, 0.05))
        await asyncio.to_thread(meta.kill)
        await asyncio.wait_for(asyncio.gather(*writers), 60)
        assert meta.proc is not None
        assert meta.proc.returncode == -9
        versions = sorted(acked.values())
        assert len(set(versions)) == len(versions)

        meta.start()
        client = client_factory(meta)
        # Retry every append whose reply was lost, with its same operation id.
        for op in unknown:
            retried = await append(client, op, rows_for(op, sizes[op]))
            assert retried.version not in versions
            again = await append(client, op, rows_for(op, sizes[op]))
            assert again.replayed
            assert again.version == retried.version
            acked[op] = retried.version
        for op, version in acked.items():
            replay = await append(client, op, rows_for(op, sizes[op]))
            assert replay.replayed
            assert replay.version == version
        final = (await client.describe_table(TABLE)).entry.descriptor.version
        assert final == len(acked)
    committed = await verify(data_dir, {op: sizes[op] for op in acked})
    assert committed == acked


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "point", ["before_lance_commit", "after_lance_commit", "after_registry_commit"]
)
async def test_crash_points(tmp_path: Path, client_factory: Any, point: str) -> None:
    data_dir = tmp_path / "data"
    hooks = fault_env(f"meta.{point}")
    meta = start_meta(data_dir, tmp_path, env=hooks)
    with running(meta):
        client = client_factory(meta)
        await client.create_table(TABLE, SCHEMA)
        lost = new_operation_id()
        with pytest.raises(LakeError):
            await append(client, lost, rows_for(lost, 3))
        assert meta.proc is not None
        assert meta.proc.wait(timeout=30) == 137

        meta.env = {}
        meta.start()
        client = client_factory(meta)
        after_registry = point == "after_registry_commit"
        described = (await client.describe_table(TABLE)).entry.descriptor
        assert described.version == (1 if after_registry else 0)

        # Another writer first: it must not inherit an unregistered Lance version.
        other = new_operation_id()
        other_result = await append(client, other, rows_for(other, 2))
        retried = await append(client, lost, rows_for(lost, 3))
        assert retried.replayed is after_registry
        assert again_version(await append(client, lost, rows_for(lost, 3))) == retried.version
        assert {other_result.version, retried.version} == {1, 2}
    await verify(data_dir, {other: 2, lost: 3})


def again_version(result: protocol.AppendResult) -> int:
    assert result.replayed
    return result.version
