"""Two Metasrv nodes share one DynamoDB authority; the leader dies, stops or is fenced.

Every test ends with the nothing-lost check from fresh processes: every
acknowledged append appears exactly once, Lake versions have no gaps, and a
new Query replica reopens the table and answers SQL.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from lake_core import faults, protocol
from lake_core.errors import LakeError
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from tests.cloud.conftest import CloudLake
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, episodes
from tools.lake_testing.faults import fault_env
from tools.lake_testing.servers import LakeProcess

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.dynamodb]

ROWS = 10
DEFAULT_TTL_S = 10.0


def append_until_acknowledged(
    client: object, start: int, op_id: str, deadline: float, failures: list[LakeError]
) -> int:
    """Retry one append with the same operation id until the server answers."""
    while True:
        try:
            return client.append_batches(EPISODES, [episodes(start, ROWS)], operation_id=op_id)  # type: ignore[attr-defined]
        except LakeError as exc:
            if not exc.retryable or time.monotonic() > deadline:
                raise
            failures.append(exc)
            time.sleep(0.2)


def nothing_lost(lake: CloudLake, acknowledged: dict[str, tuple[int, int]]) -> None:
    # Concurrent appends may share a version (a commit group): the versions the
    # appends were acknowledged at have no gaps, and the last is the table's.
    versions = {version for version, _ in acknowledged.values()}
    assert versions == set(range(1, len(versions) + 1)), "versions must have no gaps"
    described = lake.admin(lambda c: c.describe_table(EPISODES))
    assert described.entry.descriptor.version == len(versions)
    assert described.entry.descriptor.location.startswith(f"s3://{lake.bucket}/")
    fresh = lake.start_query()
    with lake.sdk(fresh) as client:
        table = client.query_table("SELECT steps FROM robots.episodes")
    counts = pc.value_counts(table["steps"]).to_pylist()
    assert all(c["counts"] == 1 for c in counts), "an acknowledged row appears twice"
    expected = {start + i for _, start in acknowledged.values() for i in range(ROWS)}
    assert set(table["steps"].to_pylist()) == expected


def two_node_lake(lake: CloudLake, first_env: dict[str, str] | None = None) -> LakeProcess:
    first = lake.start_meta(first_env)
    leader, _ = lake.wait_for_leader()
    assert leader is first
    lake.start_meta()
    lake.start_balancer()
    return first


def test_leader_sigkill_mid_stream_the_follower_takes_over_and_nothing_is_lost(
    make_cloud_lake,
) -> None:
    lake = make_cloud_lake()  # the real 10 s lease
    leader = two_node_lake(lake)
    replicas = lake.start_queries(2)
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA))

    # Enough that both writers are mid-stream when the leader dies (6 acknowledged).
    appends_each = 8
    acknowledged: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    interrupted: list[LakeError] = []

    def writer(replica: LakeProcess, base: int) -> None:
        try:
            with lake.sdk(replica) as client:
                for n in range(appends_each):
                    start, op_id = base + n * ROWS, new_operation_id()
                    deadline = time.monotonic() + 90
                    version = append_until_acknowledged(client, start, op_id, deadline, interrupted)
                    with lock:
                        acknowledged[op_id] = (version, start)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=(replica, base))
        for replica, base in zip(replicas, (0, 1_000_000), strict=True)
    ]
    for thread in threads:
        thread.start()
    while len(acknowledged) < 6:
        assert not errors, errors
        time.sleep(0.01)
    killed_at = time.monotonic()
    leader.kill()
    successor, seen_at = lake.wait_for_leader(other_than=leader, timeout_s=30)
    for thread in threads:
        thread.join(timeout=180)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert len(acknowledged) == 2 * appends_each
    assert interrupted, "the kill must land while appends are in flight"
    # The lease's 10 s TTL bounds the takeover (plus the follower's 0.5 s poll and
    # scheduling slack on a shared machine).
    print(f"takeover after SIGKILL: {seen_at - killed_at:.2f}s, {len(interrupted)} retries")
    assert seen_at - killed_at < DEFAULT_TTL_S + 2.0, seen_at - killed_at
    assert lake.leader() is successor
    nothing_lost(lake, acknowledged)


def _stream_appends(
    lake: CloudLake, starts: range, acknowledged: dict[str, tuple[int, int]], gaps: list[float]
) -> None:
    async def run() -> None:
        async with lake.meta_client() as client:
            await stream(client)

    async def stream(client: MetaClient) -> None:
        for start in starts:
            op_id = new_operation_id()
            command = protocol.AppendCommand(table=EPISODES, operation_id=op_id)
            failed_at: float | None = None
            while True:
                try:
                    result = await client.append(command, EPISODES_SCHEMA, [episodes(start, ROWS)])
                    break
                except LakeError as exc:
                    if not exc.retryable:
                        raise
                    failed_at = failed_at or time.monotonic()
                    await asyncio.sleep(0.05)
            if failed_at is not None:
                gaps.append(time.monotonic() - failed_at)
            acknowledged[op_id] = (result.version, start)

    asyncio.run(run())


def test_sigterm_on_the_leader_hands_over_well_under_the_ttl(make_cloud_lake) -> None:
    lake = make_cloud_lake()  # the real 10 s lease
    leader = two_node_lake(lake)
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA))
    acknowledged: dict[str, tuple[int, int]] = {}
    gaps: list[float] = []
    thread = threading.Thread(
        target=_stream_appends, args=(lake, range(0, 40 * ROWS, ROWS), acknowledged, gaps)
    )
    thread.start()
    while len(acknowledged) < 8:
        assert thread.is_alive()
        time.sleep(0.01)
    signalled_at = time.monotonic()
    leader.signal(signal.SIGTERM)
    successor, seen_at = lake.wait_for_leader(other_than=leader, timeout_s=DEFAULT_TTL_S)
    assert leader.proc is not None
    assert leader.proc.wait(timeout=30) == 0, "a drained shutdown exits 0"
    thread.join(timeout=120)
    assert not thread.is_alive()
    handover = seen_at - signalled_at
    print(f"handover after SIGTERM: {handover:.2f}s, writer gaps {[round(g, 2) for g in gaps]}")
    assert handover < DEFAULT_TTL_S / 4, f"handover took {handover:.2f}s"
    # Writers saw at most a short gap, not the lease TTL.
    assert all(gap < DEFAULT_TTL_S / 4 for gap in gaps), gaps
    assert lake.leader() is successor
    assert "leadership resigned" in leader.log()
    nothing_lost(lake, acknowledged)


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def test_a_fenced_old_leader_cannot_commit_after_it_resumes(make_cloud_lake) -> None:
    ttl_ms = 3000  # a test hook: this test waits out the lease once
    lake = make_cloud_lake(meta_env=fault_env(f"{faults.LEASE_TTL_MS}={ttl_ms}"))
    # The old leader stops itself (SIGSTOP) after checking its lease and just
    # before its registry write: the one window the lease clock cannot cover.
    old = two_node_lake(lake, fault_env(faults.STOP_BEFORE_HEAD_UPDATE, base=lake.meta_env))
    new = next(m for m in lake.metas if m is not old)
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA), target=old)

    fenced_op = new_operation_id()
    outcome: list[object] = []

    def append_on_old() -> None:
        async def go() -> object:
            async with lake.meta_client(old) as client:
                command = protocol.AppendCommand(table=EPISODES, operation_id=fenced_op)
                return await client.append(command, EPISODES_SCHEMA, [episodes(0, ROWS)])

        try:
            outcome.append(asyncio.run(go()))
        except LakeError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=append_on_old)
    thread.start()
    assert old.proc is not None
    deadline = time.monotonic() + 30
    while _state(old.proc.pid) != "T":
        assert time.monotonic() < deadline, "the old leader never reached its pause point"
        time.sleep(0.02)
    paused_at = time.monotonic()

    successor, seen_at = lake.wait_for_leader(other_than=old, timeout_s=ttl_ms / 1000 + 10)
    assert successor is new
    # The standby could not win before the paused leader's lease ran out.
    print(f"standby won {seen_at - paused_at:.2f}s after the leader paused (TTL {ttl_ms} ms)")
    # (It counts the TTL from the leader's last renewal, at most TTL/5 before the pause.)
    assert seen_at - paused_at > 0.5 * ttl_ms / 1000
    acknowledged: dict[str, tuple[int, int]] = {}

    async def append_on_new(op_id: str, start: int) -> int:
        async with lake.meta_client(new) as client:
            command = protocol.AppendCommand(table=EPISODES, operation_id=op_id)
            for _ in range(100):
                try:
                    result = await client.append(command, EPISODES_SCHEMA, [episodes(start, ROWS)])
                    return result.version
                except LakeError as exc:
                    if not exc.retryable:  # retryable: e.g. still taking over
                        raise
                    await asyncio.sleep(0.1)
            raise AssertionError("the new leader never committed")

    winner = new_operation_id()
    acknowledged[winner] = (asyncio.run(append_on_new(winner, 5000)), 5000)

    old.signal(signal.SIGCONT)
    thread.join(timeout=60)
    assert len(outcome) == 1
    refused = outcome[0]
    assert isinstance(refused, LakeError), f"a fenced leader committed: {refused!r}"
    assert refused.retryable
    assert "fenced" in str(refused)
    history = lake.admin(lambda c: c.describe_table(EPISODES), target=new)
    assert history.entry.descriptor.version == 1, "the fenced write must not be visible"

    # The caller retries with the same operation id: committed exactly once, by the new leader.
    version = asyncio.run(append_on_new(fenced_op, 0))
    assert version == 2
    assert asyncio.run(append_on_new(fenced_op, 0)) == 2
    acknowledged[fenced_op] = (version, 0)
    assert lake.leader() is new
    assert "fenced" in old.log()
    nothing_lost(lake, acknowledged)


def test_maintenance_sent_to_the_follower_is_forwarded_to_the_leader(make_cloud_lake) -> None:
    lake = make_cloud_lake()
    leader = two_node_lake(lake)
    follower = next(node for node in lake.metas if node is not leader)
    query = lake.start_query()
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA), target=leader)
    with lake.sdk(query) as client:
        for n in range(3):
            client.append_batches(EPISODES, [episodes(n * ROWS, ROWS)])

    indexed = lake.admin(lambda c: c.create_index(EPISODES, "steps"), target=follower)
    assert indexed.changed
    assert indexed.descriptor.version == 3
    optimized = lake.admin(lambda c: c.optimize_table(EPISODES), target=follower)
    assert optimized.descriptor.version == 3
    assert optimized.fragments_after == 1 < optimized.fragments_before == 3
    described = lake.admin(lambda c: c.describe_table(EPISODES), target=leader)
    assert described.entry.descriptor == optimized.descriptor
    with lake.sdk(query) as client:
        rows = client.query_table("SELECT steps FROM robots.episodes WHERE steps = 12")
    assert rows["steps"].to_pylist() == [12]


def test_ingest_sent_to_the_follower_is_forwarded_to_the_leader(make_cloud_lake) -> None:
    from lake_core.flight.encoding import encode_stream
    from lake_core.proto import flight_pb2 as pb

    lake = make_cloud_lake()
    leader = two_node_lake(lake)
    follower = next(node for node in lake.metas if node is not leader)
    lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA), target=leader)
    command = protocol.IngestCommand(table=EPISODES, operation_id=new_operation_id())
    descriptor = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=protocol.encode(command))

    async def stream():  # type: ignore[no-untyped-def]
        batches = [episodes(start, 5_000) for start in range(0, 20_000, 5_000)]
        for raw in encode_stream(
            EPISODES_SCHEMA, batches, descriptor=descriptor.SerializeToString()
        ):
            yield pb.FlightData.FromString(raw)
        yield pb.FlightData(app_metadata=protocol.INGEST_END)

    # Past the 10,000-row append cap, one version, committed by the leader.
    result = lake.admin(lambda c: c.ingest_messages(stream()), target=follower)
    assert (result.version, result.rows) == (1, 20_000)
    assert '"action": "ingest"' in follower.log()  # "forwarding to the leader"
    query = lake.start_query()
    with lake.sdk(query) as client:
        assert client.ingest(EPISODES, episodes(20_000, 15_000)) == 2
        table = client.query_table("SELECT steps FROM robots.episodes")
    assert sorted(table["steps"].to_pylist()) == list(range(35_000))
