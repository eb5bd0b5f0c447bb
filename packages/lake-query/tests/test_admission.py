"""Admission control: tenant gate, global FIFO, one deadline, fail-closed tracker."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lake_core.errors import ConfigError, ResourceExhausted
from lake_query.config import QueryConfig
from lake_query.serving.admission import Admission, AdmissionLimits, Permit
from tools.lake_testing.waiting import until_async


def limits(**overrides: int) -> AdmissionLimits:
    base = {"max_concurrent": 2, "per_tenant": 8, "queue_timeout_ms": 200}
    return AdmissionLimits(**{**base, **overrides})


async def admitted(admission: Admission, tenant: str) -> Permit:
    return await admission.acquire(tenant)


@pytest.mark.asyncio
async def test_global_slots_are_handed_out_in_arrival_order() -> None:
    admission = Admission(limits(max_concurrent=1, queue_timeout_ms=5_000))
    first = await admission.acquire("a")
    order: list[str] = []

    async def wait(name: str) -> Permit:
        permit = await admission.acquire(name)
        order.append(name)
        return permit

    waiters = []
    for queued, name in enumerate(("b", "c", "d"), start=1):
        waiters.append(asyncio.create_task(wait(name)))
        await until_async(lambda n=queued: admission.waiting() == n, 5, f"{name} queued")
    first.release()
    for task in waiters:
        (await task).release()
    assert order == ["b", "c", "d"]
    assert admission.running == 0
    assert admission.tracked_tenants == 0


@pytest.mark.asyncio
async def test_saturation_is_resource_exhausted_within_the_queue_timeout() -> None:
    admission = Admission(limits(queue_timeout_ms=100))
    held = [await admission.acquire("a"), await admission.acquire("b")]
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ResourceExhausted):
        await admission.acquire("c")
    assert 0.09 <= loop.time() - start < 0.5
    assert admission.tracked_tenants == 2  # c's idle gate was pruned at once
    for permit in held:
        permit.release()
        permit.release()  # idempotent
    assert admission.running == 0
    (await admission.acquire("c")).release()


@pytest.mark.asyncio
async def test_a_noisy_tenant_waits_at_its_own_gate_not_in_the_global_queue() -> None:
    admission = Admission(limits(max_concurrent=3, per_tenant=2, queue_timeout_ms=2_000))
    a1, a2 = await admission.acquire("noisy"), await admission.acquire("noisy")
    b1 = await admission.acquire("quiet")
    a3 = asyncio.create_task(admission.acquire("noisy"))  # blocked by its tenant gate
    await until_async(lambda: admission.waiting("noisy") == 1, 5, "noisy queued at its gate")
    b2 = asyncio.create_task(admission.acquire("quiet"))  # blocked by the global limit
    await until_async(lambda: admission.waiting() == 1, 5, "quiet queued globally")
    assert admission.waiting("noisy") == 1  # still at its own gate, not in the FIFO
    b1.release()
    # The freed global slot goes to quiet although noisy asked first: noisy
    # never entered the global FIFO while waiting for its own share.
    b2_permit = await asyncio.wait_for(b2, 1)
    assert not a3.done()
    a1.release()
    a3_permit = await asyncio.wait_for(a3, 1)
    for permit in (a2, a3_permit, b2_permit):
        permit.release()
    assert (admission.running, admission.tracked_tenants) == (0, 0)


@pytest.mark.asyncio
async def test_one_absolute_deadline_covers_both_gates() -> None:
    admission = Admission(limits(max_concurrent=2, per_tenant=1, queue_timeout_ms=300))
    mine = await admission.acquire("me")
    hog = await admission.acquire("other")
    loop = asyncio.get_running_loop()
    start = loop.time()
    # Queued in the global FIFO first: it takes the slot mine frees.
    third = asyncio.create_task(admission.acquire("third"))

    async def release_later() -> None:
        await asyncio.sleep(0.2)
        mine.release()  # my tenant gate frees at 200 ms; the global slot goes to "third"

    releaser = asyncio.create_task(release_later())
    with pytest.raises(ResourceExhausted):
        await admission.acquire("me")
    waited = loop.time() - start
    await releaser
    assert 0.29 <= waited < 0.45  # 300 ms in total, not 200 + 300
    (await third).release()
    hog.release()
    assert (admission.running, admission.tracked_tenants) == (0, 0)


@pytest.mark.asyncio
async def test_a_full_tenant_tracker_fails_closed() -> None:
    admission = Admission(limits(max_concurrent=10, max_tracked_tenants=2, queue_timeout_ms=1_000))
    a, b = await admission.acquire("a"), await admission.acquire("b")
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ResourceExhausted, match="too many tenants"):
        await admission.acquire("c")
    assert loop.time() - start < 0.05  # refused at once, not queued
    assert admission.tracked_tenants == 2
    a.release()
    assert admission.tracked_tenants == 1  # pruned on its last release
    (await admission.acquire("c")).release()
    b.release()
    assert admission.tracked_tenants == 0


@pytest.mark.asyncio
async def test_a_cancelled_waiter_gives_nothing_away() -> None:
    admission = Admission(limits(max_concurrent=1, queue_timeout_ms=5_000))
    held = await admission.acquire("a")
    waiter = asyncio.create_task(admission.acquire("b"))
    await until_async(lambda: admission.waiting() == 1, 5, "b queued")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    held.release()
    assert (admission.running, admission.tracked_tenants) == (0, 0)


@pytest.mark.asyncio
async def test_try_acquire_takes_only_a_free_slot_nobody_waits_for() -> None:
    admission = Admission(limits(max_concurrent=2, per_tenant=1, queue_timeout_ms=5_000))
    first = admission.try_acquire("a")
    assert first is not None
    assert admission.running == 1
    assert admission.try_acquire("a") is None  # the tenant's one slot is taken
    assert admission.tracked_tenants == 1
    other = admission.try_acquire("b")
    assert other is not None
    assert admission.running == 2
    assert admission.try_acquire("c") is None  # the global FIFO is full
    assert admission.tracked_tenants == 2  # c's new gate was pruned again
    queued = asyncio.create_task(admission.acquire("c"))
    await until_async(lambda: admission.waiting() == 1, 5, "c queued")
    first.release()  # c was waiting: the slot passes to it, not to a later try
    permit_c = await queued
    assert admission.try_acquire("d") is None
    for permit in (other, permit_c):
        permit.release()
    assert (admission.running, admission.tracked_tenants) == (0, 0)
    assert admission.try_acquire("d") is not None


@pytest.mark.asyncio
async def test_try_acquire_refuses_nothing_a_full_tracker_is_left_to_acquire() -> None:
    admission = Admission(limits(max_concurrent=10, max_tracked_tenants=1))
    held = admission.try_acquire("a")
    assert held is not None
    assert admission.try_acquire("b") is None
    with pytest.raises(ResourceExhausted, match="too many tenants"):
        await admission.acquire("b")
    held.release()
    assert admission.tracked_tenants == 0


@pytest.mark.asyncio
async def test_threads_trying_beside_the_loop_never_exceed_a_limit() -> None:
    """Data-plane threads take permits while loop tasks queue and release them."""
    admission = Admission(limits(max_concurrent=3, per_tenant=2, queue_timeout_ms=5_000))
    loop = asyncio.get_running_loop()
    peak = {"running": 0, "tenant": 0}
    stop = threading.Event()

    def observe() -> None:
        peak["running"] = max(peak["running"], admission.running)
        for gate in list(admission._tenants.values()):
            peak["tenant"] = max(peak["tenant"], gate.held)

    def thread_side(tenant: str) -> int:
        taken = 0
        while not stop.is_set():
            permit = admission.try_acquire(tenant)
            if permit is not None:
                taken += 1
                observe()
                loop.call_soon_threadsafe(permit.release)  # as the data plane releases
        return taken

    async def loop_side(tenant: str) -> None:
        for _ in range(200):
            permit = await admission.acquire(tenant)
            observe()
            await asyncio.sleep(0)
            permit.release()

    threads = [loop.run_in_executor(None, thread_side, t) for t in ("a", "b", "c")]
    await asyncio.gather(*(loop_side(t) for t in ("a", "b", "c", "d")))
    stop.set()
    taken = await asyncio.gather(*threads)
    # The last releases run on the loop.
    await until_async(lambda: admission.running == 0, 5, "every permit released")
    assert sum(taken) > 0
    assert peak["running"] <= 3
    assert peak["tenant"] <= 2
    assert (admission.running, admission.tracked_tenants) == (0, 0)


@pytest.mark.asyncio
async def test_a_permit_nobody_waits_behind_is_released_off_the_loop() -> None:
    admission = Admission(limits(max_concurrent=1, per_tenant=1, queue_timeout_ms=5_000))
    loop = asyncio.get_running_loop()
    idle = admission.try_acquire("a")
    assert idle is not None
    # From another thread, with nobody queued: released there and then.
    assert await loop.run_in_executor(None, idle.release_if_unwaited)
    assert (admission.running, admission.tracked_tenants) == (0, 0)
    assert idle.release_if_unwaited()  # idempotent
    idle.release()
    assert admission.running == 0

    held = admission.try_acquire("a")
    assert held is not None
    queued = asyncio.create_task(admission.acquire("b"))
    await until_async(lambda: admission.waiting() == 1, 5, "b queued")
    # A waiter is woken on the loop only: the thread leaves the release to it.
    assert not await loop.run_in_executor(None, held.release_if_unwaited)
    assert admission.running == 1
    assert not queued.done()
    loop.call_soon_threadsafe(held.release)  # what the data plane's releaser does next
    (await queued).release()
    assert (admission.running, admission.tracked_tenants) == (0, 0)


@pytest.mark.asyncio
async def test_threads_releasing_off_the_loop_never_exceed_a_limit() -> None:
    """As the data plane releases: off the loop when unwaited, else on it."""
    admission = Admission(limits(max_concurrent=3, per_tenant=2, queue_timeout_ms=5_000))
    loop = asyncio.get_running_loop()
    peak = {"running": 0}
    stop = threading.Event()

    def thread_side(tenant: str) -> int:
        taken = 0
        while not stop.is_set():
            permit = admission.try_acquire(tenant)
            if permit is not None:
                taken += 1
                peak["running"] = max(peak["running"], admission.running)
                if not permit.release_if_unwaited():
                    loop.call_soon_threadsafe(permit.release)
        return taken

    async def loop_side(tenant: str) -> None:
        for _ in range(200):
            permit = await admission.acquire(tenant)
            peak["running"] = max(peak["running"], admission.running)
            await asyncio.sleep(0)
            permit.release()

    threads = [loop.run_in_executor(None, thread_side, t) for t in ("a", "b", "c")]
    await asyncio.gather(*(loop_side(t) for t in ("a", "b", "c", "d")))
    stop.set()
    taken = await asyncio.gather(*threads)
    await until_async(lambda: admission.running == 0, 5, "every permit released")
    assert sum(taken) > 0
    assert peak["running"] <= 3
    assert (admission.running, admission.tracked_tenants) == (0, 0)


class FakeContext:
    def __init__(self) -> None:
        self.aborted: list[tuple[grpc.StatusCode, str]] = []

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted.append((code, details))
        raise grpc.aio.AbortError()


@pytest.mark.asyncio
async def test_run_holds_the_permit_for_the_stream_and_releases_it_on_every_end() -> None:
    admission = Admission(limits(max_concurrent=1, execution_timeout_ms=200))
    context: Any = FakeContext()
    gate = asyncio.Event()

    async def messages() -> AsyncIterator[bytes]:
        yield b"one"
        await gate.wait()
        yield b"two"

    async def start() -> AsyncIterator[bytes]:
        return messages()

    # Completion.
    gate.set()
    assert [m async for m in admission.run("t", context, start)] == [b"one", b"two"]
    assert admission.running == 0

    # The consumer going away mid-stream (client drop).
    gate.clear()
    stream = admission.run("t", context, start)
    assert await anext(stream) == b"one"
    assert admission.running == 1
    await stream.aclose()
    assert admission.running == 0

    # Execution timeout: DEADLINE_EXCEEDED, the running task cancelled, permit released.
    async def consume() -> list[bytes]:
        return [m async for m in admission.run("t", context, start)]

    task = asyncio.create_task(consume())
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert context.aborted[0][0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (admission.running, admission.tracked_tenants) == (0, 0)


def test_limits_come_from_the_environment() -> None:
    assert AdmissionLimits.from_env({}) == AdmissionLimits(
        max_concurrent=64,
        per_tenant=8,
        max_tracked_tenants=4096,
        queue_timeout_ms=100,
        execution_timeout_ms=1_800_000,
        max_sql_bytes=1_048_576,
    )
    env = {
        "LAKE_QUERY_MAX_CONCURRENT": "32",
        "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT": "4",
        "LAKE_QUERY_MAX_TRACKED_TENANTS": "100",
        "LAKE_QUERY_QUEUE_TIMEOUT_MS": "250",
        "LAKE_QUERY_EXECUTION_TIMEOUT_MS": "900000",
        "LAKE_QUERY_MAX_SQL_BYTES": "262144",
    }
    config = QueryConfig.load("127.0.0.1:50051", "http://127.0.0.1:50052", env=env)
    assert config.admission == AdmissionLimits(32, 4, 100, 250, 900_000, 262_144)


@pytest.mark.parametrize(
    "variable",
    [
        "LAKE_QUERY_MAX_CONCURRENT",
        "LAKE_QUERY_MAX_CONCURRENT_PER_TENANT",
        "LAKE_QUERY_MAX_TRACKED_TENANTS",
        "LAKE_QUERY_EXECUTION_TIMEOUT_MS",
        "LAKE_QUERY_MAX_SQL_BYTES",
    ],
)
def test_bad_limits_fail_startup_naming_the_variable(variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        QueryConfig.load("127.0.0.1:50051", "http://127.0.0.1:50052", env={variable: "0"})


def _keys(path: Path) -> str:
    key = base64.b64encode(os.urandom(32)).decode()
    path.write_text(json.dumps({"active": "k1", "keys": [{"id": "k1", "key": key}]}))
    path.chmod(0o600)
    return str(path)


def test_non_loopback_query_security_rules(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-deployment-admin-token-000")
    token.chmod(0o600)
    auth = {"LAKE_AUTH_TOKEN_FILE": str(token)}
    with pytest.raises(ConfigError, match="requires authentication"):
        QueryConfig.load("0.0.0.0:50051", "http://127.0.0.1:50052", env={})
    with pytest.raises(ConfigError, match="requires TLS"):
        QueryConfig.load("0.0.0.0:50051", "http://127.0.0.1:50052", env=auth)
    insecure = {**auth, "LAKE_ALLOW_INSECURE": "true"}
    with pytest.raises(ConfigError, match="LAKE_QUERY_TICKET_KEYS_FILE"):
        QueryConfig.load("0.0.0.0:50051", "http://127.0.0.1:50052", env=insecure)
    config = QueryConfig.load(
        "0.0.0.0:50051",
        "http://127.0.0.1:50052",
        env={**insecure, "LAKE_QUERY_TICKET_KEYS_FILE": _keys(tmp_path / "keys.json")},
    )
    assert config.security.tls is None
    assert not config.security.authenticator.development
    with pytest.raises(ConfigError, match="--metadata-addr"):
        QueryConfig.load("127.0.0.1:50051", "http://meta.internal:50052", env={})
