"""The snapshot cache's bounds: freshness, last-good, single flight, pending slots, handover."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from lake_core.errors import ResourceExhausted, Unavailable
from lake_iceberg.federation.cache import SnapshotCache
from lake_iceberg.federation.counters import CountingCounters


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Interrupted(BaseException):
    """What cancellation looks like to a loading thread."""


def _cache(clock: Clock, **kw: int) -> tuple[SnapshotCache[str], CountingCounters]:
    counters = CountingCounters()
    return SnapshotCache(clock=clock, counters=counters, **kw), counters  # type: ignore[arg-type]


def test_fresh_for_five_seconds_then_reloaded() -> None:
    clock = Clock()
    cache, counters = _cache(clock)
    loads: list[int] = []

    def load() -> str:
        loads.append(1)
        return f"v{len(loads)}"

    assert cache.get("k", load) == "v1"
    clock.now += 4.9
    assert cache.get("k", load) == "v1"
    clock.now += 0.2
    assert cache.get("k", load) == "v2"
    assert (counters.hits, counters.misses, len(loads)) == (1, 2, 2)


def test_last_good_for_sixty_seconds_after_its_load_then_the_error() -> None:
    clock = Clock()
    cache, counters = _cache(clock)
    assert cache.get("k", lambda: "good") == "good"

    def failing() -> str:
        raise Unavailable("catalog down")

    clock.now += 30
    assert cache.get("k", failing) == "good"
    clock.now += 30  # exactly 60 s after the good load: still usable
    assert cache.get("k", failing) == "good"
    clock.now += 0.5
    with pytest.raises(Unavailable):
        cache.get("k", failing)
    assert counters.failures == 3


def test_capacity_evicts_least_recently_used() -> None:
    clock = Clock()
    cache, _ = _cache(clock, capacity=3)
    for key in "abcd":
        cache.get(key, lambda key=key: key)
    assert len(cache) == 3
    loads: list[str] = []
    cache.get("a", lambda: loads.append("a") or "a")  # type: ignore[func-returns-value]
    assert loads == ["a"]


def _leader_blocked(
    cache: SnapshotCache[str], key: str, result: Callable[[], str]
) -> tuple[threading.Event, threading.Event]:
    started, release = threading.Event(), threading.Event()

    def load() -> str:
        started.set()
        release.wait(30)
        return result()

    threading.Thread(target=lambda: _swallow(lambda: cache.get(key, load)), daemon=True).start()
    assert started.wait(30)
    return started, release


def _swallow(fn: Callable[[], object]) -> None:
    with contextlib.suppress(BaseException):
        fn()


def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for the cache's own state to show the event (no fixed sleep)."""
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    raise TimeoutError("condition not reached")


def test_single_flight_per_key_and_followers_take_no_slot() -> None:
    clock = Clock()
    cache, _ = _cache(clock, max_pending=1)
    loads: list[int] = []

    def counted() -> str:
        loads.append(1)
        return "v"

    _, release = _leader_blocked(cache, "k", counted)
    with ThreadPoolExecutor(20) as pool:
        followers = [pool.submit(cache.get, "k", counted) for _ in range(20)]
        _until(lambda: cache.waiting == 20)
        # A second distinct key would need a second slot: refused, before its load runs.
        with pytest.raises(ResourceExhausted):
            cache.get("other", lambda: pytest.fail("no I/O past the pending bound"))
        release.set()
        assert [f.result(30) for f in followers] == ["v"] * 20
    assert len(loads) == 1
    assert cache.pending == 0


def test_65th_distinct_pending_key_fails_before_its_load() -> None:
    cache, _ = _cache(Clock())
    releases = [_leader_blocked(cache, f"k{i}", lambda: "v")[1] for i in range(64)]
    assert cache.pending == 64
    with pytest.raises(ResourceExhausted):
        cache.get("k64", lambda: pytest.fail("no I/O past the pending bound"))
    for release in releases:
        release.set()


def test_failed_load_is_shared_by_its_waiters() -> None:
    cache, counters = _cache(Clock())

    def fail() -> str:
        raise Unavailable("down")

    _, release = _leader_blocked(cache, "k", fail)
    with ThreadPoolExecutor(5) as pool:
        waiters = [
            pool.submit(cache.get, "k", lambda: pytest.fail("waiters do not load"))
            for _ in range(5)
        ]
        _until(lambda: cache.waiting == 5)
        release.set()
        for waiter in waiters:
            with pytest.raises(Unavailable):
                waiter.result(30)
    assert counters.failures == 1


def test_an_interrupted_leader_hands_over_to_a_waiter() -> None:
    cache, _ = _cache(Clock())
    started, release = threading.Event(), threading.Event()
    leader_gone = threading.Event()

    def interrupted() -> str:
        started.set()
        release.wait(30)
        raise Interrupted

    def leader() -> None:
        try:
            cache.get("k", interrupted)
        except Interrupted:
            leader_gone.set()

    threading.Thread(target=leader, daemon=True).start()
    assert started.wait(30)
    replacement_loads: list[int] = []
    waiting = threading.Barrier(4)

    def follower() -> str:
        waiting.wait(30)
        return cache.get("k", lambda: replacement_loads.append(1) or "replacement")  # type: ignore[func-returns-value]

    with ThreadPoolExecutor(3) as pool:
        followers = [pool.submit(follower) for _ in range(3)]
        waiting.wait(30)
        _until(lambda: cache.waiting == 3)
        release.set()
        assert leader_gone.wait(30)
        assert [f.result(30) for f in followers] == ["replacement"] * 3
    assert len(replacement_loads) == 1
    assert cache.pending == 0
