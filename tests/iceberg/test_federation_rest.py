"""The federation's catalog client under faults, through a fault-injecting proxy.

OAuth single flight (one renewal for 20 readers, a failed renewal shared,
static tokens never refreshed), stale-if-error within 60 s of the last good
load, a stalled catalog bounded by the timeout, the 65th distinct pending key
refused before I/O, and a ticket check that never reads the cache.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lake_core.errors import ConfigError, ResourceExhausted, Unavailable
from lake_iceberg.federation import CountingCounters, FederationConfig, IcebergFederation
from lake_iceberg.federation.cache import SnapshotCache
from lake_iceberg.federation.counters import CounterSwitch
from tools.lake_testing.catalog_proxy import CatalogProxy
from tools.lake_testing.iceberg import SeaweedIceberg, federation_env, write_episodes

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

NAMESPACE = "faults"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def upstream(iceberg_server: SeaweedIceberg) -> SeaweedIceberg:
    write_episodes(iceberg_server.catalog(), NAMESPACE)
    return iceberg_server


@pytest.fixture
def proxy(upstream: SeaweedIceberg) -> Iterator[CatalogProxy]:
    front = CatalogProxy(upstream.iceberg_endpoint).start()
    try:
        yield front
    finally:
        front.stop()


Make = Callable[..., IcebergFederation]


@pytest.fixture
def make(upstream: SeaweedIceberg, proxy: CatalogProxy) -> Iterator[Make]:
    made: list[IcebergFederation] = []

    def build(clock: Clock | None = None, **env: str) -> IcebergFederation:
        variables = {**federation_env(upstream, NAMESPACE, endpoint=proxy.endpoint), **env}
        variables = {k: v for k, v in variables.items() if v}
        config = FederationConfig.from_env(variables)
        assert config is not None
        counters = CountingCounters()
        # The cache counts into the same place as the federation's REST client.
        cache: SnapshotCache[Any] = SnapshotCache(
            counters=CounterSwitch(counters), **({"clock": clock} if clock else {})
        )
        federation = IcebergFederation(config, counters=counters, cache=cache)
        federation.start()
        made.append(federation)
        return federation

    yield build
    for federation in made:
        federation.close()


def _readers(count: int, fn: Callable[[], Any]) -> list[Any]:
    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(fn) for _ in range(count)]
        return [f.exception(60) or f.result() for f in futures]


def test_a_401_triggers_one_renewal_shared_by_20_readers(make: Make, proxy: CatalogProxy) -> None:
    federation = make()
    assert proxy.requests["token"] == 1  # the session's first token
    gets = proxy.requests["GET"]
    proxy.expire_tokens = 20
    proxy.hold_tokens = True
    results: list[Any] = []
    done = threading.Thread(
        target=lambda: results.extend(
            _readers(20, lambda: federation.rest.load_table(NAMESPACE, "episodes"))
        )
    )
    done.start()
    proxy.wait_requests("GET", gets + 20)  # all 20 refused with the old token
    proxy.wait_requests("token", 2)  # one renewal, held at the proxy
    proxy.release_tokens()
    done.join(60)
    assert len(results) == 20
    assert all(r is not None and r.metadata for r in results), results
    assert proxy.requests["token"] == 2
    assert proxy.requests["GET"] == gets + 40  # each reader retried exactly once
    assert federation.counters.target.renewals == 1  # type: ignore[attr-defined]


def test_a_failed_renewal_is_shared_too(make: Make, proxy: CatalogProxy) -> None:
    federation = make()
    gets = proxy.requests["GET"]
    proxy.expire_tokens = 20
    proxy.token_status = 401
    proxy.hold_tokens = True
    results: list[Any] = []
    done = threading.Thread(
        target=lambda: results.extend(
            _readers(20, lambda: federation.rest.load_table(NAMESPACE, "episodes"))
        )
    )
    done.start()
    proxy.wait_requests("GET", gets + 20)
    proxy.wait_requests("token", 2)
    proxy.release_tokens()
    done.join(60)
    assert len(results) == 20
    assert all(isinstance(r, Unavailable) for r in results), results
    assert proxy.requests["token"] == 2  # one failed exchange, not one per reader
    assert proxy.requests["GET"] == gets + 20  # no retry without a new token
    for result in results:
        assert upstream_secret(federation) not in str(result)


def upstream_secret(federation: IcebergFederation) -> str:
    assert federation.config.oauth is not None
    return federation.config.oauth.client_secret.reveal()


def test_a_static_token_is_never_refreshed(
    make: Make, proxy: CatalogProxy, upstream: SeaweedIceberg
) -> None:
    federation = make(LAKE_ICEBERG_REST_CREDENTIAL="", LAKE_ICEBERG_REST_TOKEN=upstream.token())
    assert federation.rest.load_table(NAMESPACE, "episodes") is not None
    proxy.expire_tokens = 1
    with pytest.raises(Unavailable):
        federation.rest.load_table(NAMESPACE, "episodes")
    assert proxy.requests["token"] == 0
    assert federation.counters.target.renewals == 0  # type: ignore[attr-defined]


def test_5xx_serves_last_good_for_60_s_then_fails(make: Make, proxy: CatalogProxy) -> None:
    clock = Clock()
    federation = make(clock)
    good = federation.plan(NAMESPACE, "episodes")
    assert good.snapshot_id is not None
    clock.now += 10  # stale: a refresh is due
    proxy.fail_requests, proxy.fail_status = 1, 500
    gets = proxy.requests["GET"]
    assert federation.plan(NAMESPACE, "episodes").snapshot_id == good.snapshot_id
    assert proxy.requests["GET"] == gets + 1  # it did try the catalog
    clock.now += 50.5  # 60.5 s after the good load
    proxy.fail_requests, proxy.fail_status = 1, 503
    with pytest.raises(Unavailable):
        federation.plan(NAMESPACE, "episodes")
    assert federation.counters.target.failures == 2  # type: ignore[attr-defined]


def test_a_fresh_entry_is_served_without_a_request(make: Make, proxy: CatalogProxy) -> None:
    clock = Clock()
    federation = make(clock)
    federation.plan(NAMESPACE, "episodes")
    gets = proxy.requests["GET"]
    clock.now += 4
    federation.plan(NAMESPACE, "episodes")
    assert proxy.requests["GET"] == gets
    # The ticket check never reads the cache: a fresh load every time.
    pin = federation.plan(NAMESPACE, "episodes").snapshot_id
    federation.pinned(NAMESPACE, "episodes", pin)
    assert proxy.requests["GET"] == gets + 1


def test_a_stalled_catalog_hits_the_timeout(make: Make, proxy: CatalogProxy) -> None:
    federation = make(LAKE_ICEBERG_REST_TIMEOUT_MS="2000")
    proxy.stall_requests = 1
    started = time.monotonic()
    with pytest.raises(Unavailable) as info:
        federation.plan(NAMESPACE, "episodes")
    assert "2000 ms" in str(info.value)
    assert time.monotonic() - started < 30  # bounded, not hung


def test_the_65th_distinct_pending_key_fails_before_io(make: Make, proxy: CatalogProxy) -> None:
    federation = make()
    gets = proxy.requests["GET"]
    proxy.stall_requests = 64
    pool = ThreadPoolExecutor(64)
    try:
        for i in range(64):
            pool.submit(lambda i=i: federation.plan(NAMESPACE, f"pending_{i}"))
        proxy.wait_requests("GET", gets + 64)
        assert federation.cache.pending == 64
        with pytest.raises(ResourceExhausted):
            federation.plan(NAMESPACE, "pending_64")
        assert proxy.requests["GET"] == gets + 64  # refused before any request
        # A caller of an already-pending key waits instead of failing.
        waiter = pool.submit(federation.plan, NAMESPACE, "pending_0")
        assert not waiter.done()
    finally:
        proxy.stop()  # releases the stalled requests
        pool.shutdown(wait=True, cancel_futures=True)


def test_startup_refuses_a_missing_namespace(upstream: SeaweedIceberg, proxy: CatalogProxy) -> None:
    env = federation_env(upstream, f"{NAMESPACE},nosuchns", endpoint=proxy.endpoint)
    config = FederationConfig.from_env(env)
    assert config is not None
    federation = IcebergFederation(config)
    try:
        with pytest.raises(ConfigError) as info:
            federation.start()
    finally:
        federation.close()
    assert "nosuchns" in str(info.value)
    assert upstream.secret_key not in str(info.value)
    assert set(proxy.requests) <= {"GET", "HEAD", "token"}  # point checks, no listing


def test_counters_are_switched_in_and_carry_no_labels(
    upstream: SeaweedIceberg, proxy: CatalogProxy
) -> None:
    """The seam the metrics wiring uses: four label-free counts, switched in after start."""
    config = FederationConfig.from_env(federation_env(upstream, NAMESPACE, endpoint=proxy.endpoint))
    assert config is not None
    federation = IcebergFederation(config)
    try:
        federation.start()
        counts = CountingCounters()
        federation.use_counters(counts)
        federation.plan(NAMESPACE, "episodes")
        federation.plan(NAMESPACE, "episodes")
        proxy.expire_tokens = 1
        federation.pinned(NAMESPACE, "episodes", None)
    finally:
        federation.close()
    assert (counts.misses, counts.hits, counts.renewals, counts.failures) == (1, 1, 1, 0)
