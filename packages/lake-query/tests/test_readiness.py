"""Readiness: named reasons, refusals while any is set, health following it."""

from __future__ import annotations

import asyncio

import pytest

from lake_core.errors import Unavailable
from lake_query.serving.readiness import CATALOG, Readiness, follow_health


def test_serves_only_when_no_reason_is_set() -> None:
    readiness = Readiness()
    readiness.check()  # no reason: serves
    changes: list[bool] = []
    readiness.watch(changes.append)
    readiness.block(CATALOG, "no catalog yet")
    readiness.block("planners", "every planner is stuck")
    with pytest.raises(Unavailable, match="no catalog yet") as refused:
        readiness.check()
    assert refused.value.retryable
    readiness.clear(CATALOG)
    with pytest.raises(Unavailable, match="every planner is stuck"):
        readiness.check()
    readiness.clear("planners")
    readiness.clear("planners")  # idempotent
    readiness.check()
    # Told now, then only when serving turns off and on.
    assert changes == [True, False, True]


class FakeServer:
    def __init__(self) -> None:
        self.states: list[bool] = []

    async def set_serving(self, serving: bool) -> None:
        self.states.append(serving)


@pytest.mark.asyncio
async def test_health_follows_readiness_from_any_thread() -> None:
    readiness = Readiness()
    readiness.block(CATALOG, "no catalog yet")
    server = FakeServer()
    follow_health(readiness, server, asyncio.get_running_loop())
    await asyncio.sleep(0.05)
    assert server.states == [False]
    await asyncio.to_thread(readiness.clear, CATALOG)
    await asyncio.sleep(0.05)
    assert server.states[-1] is True
