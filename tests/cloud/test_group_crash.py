"""Cloud mode: Metasrv dies at each step of a commit group; the group lands whole or not at all.

A real ``lake meta`` on SeaweedFS + dynalite, armed to crash at one commit
step while a group of four appends commits (the test-only fault setting
``meta.commit_group_gather`` makes the committer wait for all four). A new
leader then answers every retry exactly once, and a fresh Query replica
reads each append's rows exactly once, and lists the versions (``$versions``)
exactly as the walk through every manifest does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pyarrow.compute as pc
import pytest

from lake_core import faults, protocol
from lake_core.cloud import DatasetStorage
from lake_core.errors import LakeError
from lake_core.ids import new_operation_id
from lake_query.planning import DatasetOpener
from lake_query.planning.versions import history, lance_steps, versions_table
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, episodes
from tools.lake_testing.faults import fault_env

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.dynamodb]

ROWS = 10
GROUP = 4
T = TypeVar("T")


@pytest.mark.parametrize(
    "point", ["before_lance_commit", "after_lance_commit", "after_registry_commit"]
)
def test_a_crash_at_each_step_of_a_group_commit_lands_all_or_none(
    make_cloud_lake, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = make_cloud_lake(meta_env=fault_env(f"{faults.LEASE_TTL_MS}=2000"))
    armed = lake.start_meta(
        fault_env(f"meta.{point}", f"{faults.COMMIT_GROUP_GATHER}={GROUP}", base=lake.meta_env)
    )
    lake.wait_for_leader()
    ops = [new_operation_id() for _ in range(GROUP)]
    starts = {op: 1000 * n for n, op in enumerate(ops)}

    async def append(client: object, op: str) -> protocol.AppendResult:
        command = protocol.AppendCommand(table=EPISODES, operation_id=op)
        return await client.append(command, EPISODES_SCHEMA, [episodes(starts[op], ROWS)])  # type: ignore[attr-defined]

    async def crash() -> list[object]:
        async with lake.meta_client(armed) as client:
            await client.create_table(EPISODES, EPISODES_SCHEMA)
            return list(
                await asyncio.gather(*(append(client, op) for op in ops), return_exceptions=True)
            )

    outcomes = asyncio.run(crash())
    assert all(isinstance(o, LakeError) for o in outcomes), outcomes
    assert armed.proc is not None
    assert armed.proc.wait(timeout=30) == faults.CRASH_EXIT_CODE
    armed.stop()
    lake.metas.remove(armed)  # the balancer below routes to the successor alone

    successor = lake.start_meta()
    lake.wait_for_leader()
    lake.start_balancer()
    landed = point == "after_registry_commit"

    async def answered(call: Callable[[], Awaitable[T]]) -> T:
        # A new leader may still say "no leader elected" for a moment after the
        # lease shows it (a busy machine): retry what is retryable, as clients do.
        deadline = time.monotonic() + 60
        while True:
            try:
                return await call()
            except LakeError as exc:
                if not exc.retryable or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def retry() -> tuple[int, list[protocol.AppendResult], list[protocol.AppendResult]]:
        async with lake.meta_client(successor) as client:
            described = await answered(lambda: client.describe_table(EPISODES))
            before = described.entry.descriptor.version
            first = [await answered(lambda op=op: append(client, op)) for op in ops]
            again = [await answered(lambda op=op: append(client, op)) for op in ops]
            return before, first, again

    before, first, again = asyncio.run(retry())
    assert before == (1 if landed else 0), "a group lands whole or not at all"
    assert {r.replayed for r in first} == {landed}
    if landed:
        assert {r.version for r in first} == {1}
    assert all(r.replayed for r in again)
    assert [r.version for r in again] == [r.version for r in first]

    fresh = lake.start_query()
    with lake.sdk(fresh) as client:
        table = client.query_table("SELECT steps FROM robots.episodes")
    counts = pc.value_counts(table["steps"]).to_pylist()
    assert all(c["counts"] == 1 for c in counts), "a row appears twice"
    expected = {starts[op] + i for op in ops for i in range(ROWS)}
    assert set(table["steps"].to_pylist()) == expected

    # $versions, read from the ends of Lance's files, lists what the walk through
    # every manifest does at the same head (a DynamoDB registry; after a crash
    # between Lance's commit and the registry's, an orphan behind a Restore).
    with lake.sdk(fresh) as client:
        listing = client.versions(EPISODES)
    assert listing["version"].to_pylist() == ([0, 1] if landed else list(range(GROUP + 1)))
    if point == "after_lance_commit":  # the orphan (and the Restore over it) are not listed
        assert listing["engine_version"].to_pylist()[-1] > listing.num_rows
    for key, value in lake.query_env.items():
        monkeypatch.setenv(key, value)  # Lance reads credentials from the environment
    head = lake.admin(lambda c: c.describe_table(EPISODES), successor).entry.descriptor
    dataset = DatasetOpener(DatasetStorage.from_env(lake.query_env)).open(EPISODES, head)
    walked = versions_table(history(dataset, head, lance_steps(dataset)))
    assert listing.to_pylist() == walked.to_pylist()
