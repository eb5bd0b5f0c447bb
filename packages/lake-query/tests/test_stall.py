"""A DoGet whose client stops taking messages is ended at the stall timeout.

Only time spent waiting for the client counts: a slow producer (a long scan)
is not a stall.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from lake_core.errors import ConfigError
from lake_query.config import QueryConfig
from lake_query.serving.admission import Admission, AdmissionLimits
from lake_query.serving.stall import STALL_TIMEOUT_MS


class FakeContext:
    def __init__(self) -> None:
        self.aborted: list[tuple[grpc.StatusCode, str]] = []

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append((code, details))
        raise grpc.aio.AbortError()


def admission(stall_ms: int) -> Admission:
    return Admission(AdmissionLimits(max_concurrent=4, per_tenant=1, stall_timeout_ms=stall_ms))


async def three(pause_s: float = 0.0) -> AsyncIterator[bytes]:
    for message in (b"one", b"two", b"three"):
        await asyncio.sleep(pause_s)
        yield message


@pytest.mark.asyncio
async def test_a_client_that_stops_taking_messages_is_ended_and_its_permit_freed() -> None:
    gate = admission(stall_ms=200)
    context: Any = FakeContext()

    async def start() -> AsyncIterator[bytes]:
        return three()

    async def take_one_then_stall() -> None:
        stream = gate.run("t", context, start)
        assert await anext(stream) == b"one"
        await asyncio.Event().wait()  # never asks for the next message

    loop = asyncio.get_running_loop()
    began = loop.time()
    task = asyncio.create_task(take_one_then_stall())
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    waited = loop.time() - began
    assert 0.2 <= waited < 5
    [(code, details)] = context.aborted
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert STALL_TIMEOUT_MS in details
    assert (gate.running, gate.tracked_tenants) == (0, 0)
    permit = await gate.acquire("t")  # the tenant's one slot is free again
    permit.release()


@pytest.mark.asyncio
async def test_a_slow_producer_with_a_reading_client_is_not_a_stall() -> None:
    gate = admission(stall_ms=100)
    context: Any = FakeContext()

    async def start() -> AsyncIterator[bytes]:
        return three(pause_s=0.3)  # each message takes 3 stall timeouts to produce

    assert [m async for m in gate.run("t", context, start)] == [b"one", b"two", b"three"]
    assert context.aborted == []
    assert gate.running == 0


def test_the_stall_timeout_is_validated_at_startup() -> None:
    env = {STALL_TIMEOUT_MS: "1500"}
    config = QueryConfig.load("127.0.0.1:50051", "http://127.0.0.1:50052", env=env)
    assert config.admission.stall_timeout_ms == 1500
    assert AdmissionLimits.from_env({}).stall_timeout_ms == 60_000
    for bad in ("0", "-1", "1.5", "soon", str(10**12)):
        with pytest.raises(ConfigError, match=STALL_TIMEOUT_MS):
            QueryConfig.load(
                "127.0.0.1:50051", "http://127.0.0.1:50052", env={STALL_TIMEOUT_MS: bad}
            )
