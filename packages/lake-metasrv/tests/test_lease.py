"""The leader lease on dynalite: one winner, fast resignation, and stop-before-win.

These use a short TTL to stay quick; the processes in tests/cloud run the
real 10 s default.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lake_core.tls import ClientTLS
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.forwarding import ForwardingMetaHandler, PeerClients
from lake_metasrv.lease import DEFAULT_LEASE_TTL_S, Leadership
from lake_metasrv.registry.dynamo import DynamoRegistry, NotLeader
from tools.lake_testing.waiting import until_async

pytestmark = pytest.mark.dynamodb

TTL_S = 1.5


@pytest.fixture
def registry(dynamo_registry: DynamoRegistry) -> DynamoRegistry:
    return dynamo_registry


def node(registry: DynamoRegistry, name: str) -> Leadership:
    return Leadership(
        registry.client,
        registry.table,
        f"https://{name}.lake-meta:50052",
        ttl_s=TTL_S,
        on_elected=registry.take_authority,
        node=name,
    )


def test_default_ttl_is_ten_seconds() -> None:
    assert DEFAULT_LEASE_TTL_S == 10.0


@pytest.mark.asyncio
async def test_one_of_two_candidates_leads_and_the_other_knows_where(
    registry: DynamoRegistry,
) -> None:
    a, b = node(registry, "a"), node(registry, "b")
    a.start()
    await until_async(lambda: a.is_leader, 10)
    b.start()
    await asyncio.sleep(TTL_S * 2)  # b watches a renewing lease: it must not take it
    try:
        assert a.is_leader
        assert not b.is_leader
        assert b.leader_url == "https://a.lake-meta:50052"
        assert a.leader_url is None
        with pytest.raises(NotLeader):
            b.epoch()
        assert a.epoch() == 1
    finally:
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_resigning_hands_over_without_waiting_out_the_ttl(registry: DynamoRegistry) -> None:
    a, b = node(registry, "a"), node(registry, "b")
    a.start()
    await until_async(lambda: a.is_leader, 10)
    b.start()
    await until_async(lambda: b.leader_url is not None, 10, "b seeing the lease")
    try:
        resigned_at = time.monotonic()
        assert await a.resign()
        with pytest.raises(NotLeader):
            a.epoch()
        won_at = await until_async(lambda: b.is_leader, TTL_S)
        assert won_at - resigned_at < TTL_S / 2
        assert b.epoch() == 2
    finally:
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_a_silent_leader_stops_committing_before_another_can_win(
    registry: DynamoRegistry,
) -> None:
    a, b = node(registry, "a"), node(registry, "b")
    a.start()
    await until_async(lambda: a.is_leader, 10)
    b.start()
    await until_async(lambda: b.leader_url is not None, 10, "b seeing the lease")
    try:
        # As if paused: a's loop stops renewing, but nothing tells a it lost.
        assert a._task is not None
        a._task.cancel()
        silenced_at = time.monotonic()
        a_stopped = asyncio.create_task(until_async(lambda: not a.is_leader, TTL_S * 3))
        b_won = asyncio.create_task(until_async(lambda: b.is_leader, TTL_S * 3))
        stopped_at, won_at = await a_stopped, await b_won
        assert stopped_at < won_at
        assert won_at - silenced_at < TTL_S * 2
        assert b.epoch() > 1
        with pytest.raises(NotLeader):
            a.epoch()
    finally:
        await a.close()
        await b.close()


class _Direct:
    """A call's context as a client sends it (not forwarded by another node)."""

    def invocation_metadata(self) -> tuple[()]:
        return ()


@pytest.mark.asyncio
async def test_a_node_taking_over_settles_when_its_takeover_ends(
    registry: DynamoRegistry, tmp_path: Path
) -> None:
    """Writes that reach a new leader mid-takeover wait for it (forwarding.SETTLE_S)."""
    release = asyncio.Event()

    async def slow_takeover(epoch: int) -> object:
        await release.wait()
        return await registry.take_authority(epoch)

    a = Leadership(
        registry.client,
        registry.table,
        "https://a.lake-meta:50052",
        ttl_s=TTL_S * 4,
        on_elected=slow_takeover,
        node="a",
    )
    coordinator = CommitCoordinator.local(MetaConfig.load(data_dir=tmp_path, env={}))
    handler = ForwardingMetaHandler(coordinator, a, PeerClients(None, ClientTLS()))
    a.start()
    try:
        await until_async(lambda: a.view()["leader_url"] == a.url, 10, "a winning the lease")
        assert not a.is_leader  # won, still taking over
        with pytest.raises(NotLeader, match="taking over"):
            a.epoch()
        started = time.monotonic()
        await a.settled(0.3)  # a bounded wait: it returns unsettled
        assert 0.25 <= time.monotonic() - started < 2
        assert not a.is_leader
        # A write reaching the handler now waits, then is committed here (no leader to forward to).
        waiting = asyncio.create_task(handler._leader(_Direct()))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        release.set()
        assert await asyncio.wait_for(waiting, 5) is None
        assert a.is_leader
        assert a.epoch() == 1
    finally:
        release.set()
        await a.close()


@pytest.mark.asyncio
async def test_a_starting_follower_settles_once_it_has_read_the_lease(
    registry: DynamoRegistry,
) -> None:
    a = node(registry, "a")
    a.start()
    await until_async(lambda: a.is_leader, 10)
    b = node(registry, "b")
    try:
        assert b.leader_url is None  # not started: it has read nothing
        b.start()
        await asyncio.wait_for(b.settled(30), 5)
        assert b.leader_url == "https://a.lake-meta:50052"
        assert not b.is_leader
    finally:
        await a.close()
        await b.close()
