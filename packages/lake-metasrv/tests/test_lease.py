"""The leader lease on dynalite: one winner, fast resignation, and stop-before-win.

These use a short TTL to stay quick; the processes in tests/cloud run the
real 10 s default.
"""

from __future__ import annotations

import asyncio
import time

import pytest

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
