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
    """Check the nothing-lost invariants from outside the server; return op -> version.

    A version holds a commit group: every operation it names adds exactly
    its own rows, and no operation is in two versions.
    """
    registry = SqliteRegistry(data_dir / "registry.sqlite3")
    await registry.open()
    try:
        record = await registry.get_table(TABLE)
        assert record is not None
        history = await registry.versions(record.incarnation)
        assert [v.version for v in history] == list(range(record.version + 1)), "version gap"
        assert history[-1].engine_version == record.engine_version
        ops = [op for v in history[1:] for op in v.operation_ids]
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
                assert v.operation_ids, f"v{v.version} names no operation"
                assert added == {
                    f"{op}/{i}" for op in v.operation_ids for i in range(expected[op])
                }, f"v{v.version}"
            previous = ids
        return {op: v.version for v in history[1:] for op in v.operation_ids}
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
        versions = set(acked.values())  # concurrent writers share versions (commit groups)

        meta.start()
        client = client_factory(meta)
        # Retry every append whose reply was lost, with its same operation id.
        for op in unknown:
            retried = await append(client, op, rows_for(op, sizes[op]))
            if not retried.replayed:  # it had not landed: a version of its own, after the crash
                assert retried.version > max(versions)
            again = await append(client, op, rows_for(op, sizes[op]))
            assert again.replayed
            assert again.version == retried.version
            acked[op] = retried.version
        for op, version in acked.items():
            replay = await append(client, op, rows_for(op, sizes[op]))
            assert replay.replayed
            assert replay.version == version
        final = (await client.describe_table(TABLE)).entry.descriptor.version
        assert set(acked.values()) == set(range(1, final + 1))
    committed = await verify(data_dir, {op: sizes[op] for op in acked})
    assert committed == acked


@pytest.mark.asyncio
async def test_a_new_client_reaches_a_restarted_metasrv_at_once(tmp_path: Path) -> None:
    """A client made after Metasrv came back connects, whatever older clients' state.

    gRPC shares connections between channels of one target and options: a new
    client used to inherit an older client's failed connection to the killed
    process and fail fast ("Connection refused") until that one's reconnect
    backoff ran out, though the new process was already serving.
    """
    meta = start_meta(tmp_path / "data", tmp_path)
    with running(meta):
        old = MetaClient(meta.url, timeout_s=20, max_reconnect_backoff_ms=5_000)
        try:
            await old.create_table(TABLE, SCHEMA)
            await append(old, new_operation_id(), rows_for("before", 1))
            for _ in range(3):
                await asyncio.to_thread(meta.kill)
                restarted = asyncio.Event()

                async def retry_until(restarted: asyncio.Event) -> None:
                    # An old client retrying through the outage, its backoff growing.
                    while not restarted.is_set():
                        with contextlib.suppress(LakeError):
                            await append(old, new_operation_id(), rows_for("outage", 1))
                        await asyncio.sleep(0.05)

                retrying = asyncio.create_task(retry_until(restarted))
                await asyncio.sleep(3)  # long enough for a backoff of seconds
                await asyncio.to_thread(meta.start)
                new = MetaClient(meta.url, timeout_s=20, max_reconnect_backoff_ms=5_000)
                try:
                    op = new_operation_id()
                    result = await append(new, op, rows_for(op, 1))
                    assert not result.replayed
                finally:
                    restarted.set()
                    await retrying
                    await new.close()
        finally:
            await old.close()


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


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "point", ["before_lance_commit", "after_lance_commit", "after_registry_commit"]
)
async def test_crash_points_of_a_commit_group(
    tmp_path: Path, client_factory: Any, point: str
) -> None:
    """A crash at each step of a group commit: the group lands whole, or not at all, once."""
    data_dir = tmp_path / "data"
    # The committer waits for all four appends, so the crash hits one group of four.
    hooks = fault_env(f"meta.{point}", "meta.commit_group_gather=4")
    meta = start_meta(data_dir, tmp_path, env=hooks)
    with running(meta):
        client = client_factory(meta)
        await client.create_table(TABLE, SCHEMA)
        group = [new_operation_id() for _ in range(4)]
        sizes = {op: 1 + n for n, op in enumerate(group)}
        outcomes = await asyncio.gather(
            *(append(client, op, rows_for(op, sizes[op])) for op in group),
            return_exceptions=True,
        )
        assert all(isinstance(o, LakeError) for o in outcomes), outcomes
        assert meta.proc is not None
        assert meta.proc.wait(timeout=30) == 137

        meta.env = {}
        meta.start()
        client = client_factory(meta)
        landed = point == "after_registry_commit"
        described = (await client.describe_table(TABLE)).entry.descriptor
        assert described.version == (1 if landed else 0)  # all four, or none

        # Another writer first: it must not inherit an unregistered Lance version.
        other = new_operation_id()
        await append(client, other, rows_for(other, 2))
        retried = [await append(client, op, rows_for(op, sizes[op])) for op in group]
        assert {r.replayed for r in retried} == {landed}
        if landed:
            assert {r.version for r in retried} == {1}
        for op, first in zip(group, retried, strict=True):
            assert again_version(await append(client, op, rows_for(op, sizes[op]))) == first.version
    committed = await verify(data_dir, {other: 2, **sizes})
    assert committed == {
        other: 2 if landed else 1,
        **{op: r.version for op, r in zip(group, retried, strict=True)},
    }
