"""Planning's catalog view: within the freshness bound and at the client's committed versions."""

from __future__ import annotations

import asyncio
import time

import pytest

from lake_core.errors import Unavailable
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_query.planning.catalog_cache import CatalogCache
from lake_query.planning.freshness import behind, catch_up

from .conftest import ROBOTS_ONLY, LocalCatalog, rewards

ADMIN = Principal(principal_id="p", tenant_id="t", role="admin")
REWARDS = TableRef("robots", "rewards")


@pytest.mark.asyncio
async def test_a_view_older_than_the_bound_is_refreshed_before_planning(
    catalog: LocalCatalog,
) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=0.05)  # no background task: start() is not run
    await cache.refresh()
    calls = catalog.calls
    await catch_up(cache, {}, ADMIN, 5)
    assert catalog.calls == calls  # fresh: no RPC
    await asyncio.sleep(0.1)
    catalog.append("robots.rewards", rewards(10**6, 1))
    await catch_up(cache, {}, ADMIN, 5)
    assert catalog.calls == calls + 1
    assert cache.entry(REWARDS).descriptor.version == 2  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_a_committed_version_the_view_lacks_is_fetched(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=3600)
    await cache.refresh()
    catalog.append("robots.rewards", rewards(10**6, 1))
    calls = catalog.calls
    assert behind(cache, {REWARDS: 2}, ADMIN) == ["robots.rewards"]
    # A table the caller may not see is ignored (no refresh on its behalf).
    assert behind(cache, {TableRef("secret", "plans"): 99}, ROBOTS_ONLY) == []
    await catch_up(cache, {REWARDS: 2}, ADMIN, 5)
    assert catalog.calls == calls + 1
    assert behind(cache, {REWARDS: 2}, ADMIN) == []
    await catch_up(cache, {REWARDS: 1}, ADMIN, 5)  # already there: no RPC
    assert catalog.calls == calls + 1


@pytest.mark.asyncio
async def test_an_unconfirmed_committed_version_is_unavailable(catalog: LocalCatalog) -> None:
    cache = CatalogCache(catalog, refresh_interval_s=0.01)
    await cache.refresh()
    await asyncio.sleep(0.05)
    catalog.fail = True
    # A stale view whose refresh fails is still planned on...
    await catch_up(cache, {}, ADMIN, 5)
    # ...but a client's own commit that cannot be confirmed, tried again until the
    # timeout, is a retryable refusal.
    calls = catalog.calls
    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"robots\.rewards.*tries in 0.5 s"):
        await catch_up(cache, {REWARDS: 5}, ADMIN, 0.5)
    assert 0.4 <= time.monotonic() - started < 5
    assert catalog.calls - calls >= 3  # 0.05, 0.1, 0.2 s apart


@pytest.mark.asyncio
async def test_a_committed_version_waits_out_a_catalog_outage(catalog: LocalCatalog) -> None:
    """A leader takeover: the refresh fails for a while, then the commit is confirmed."""
    cache = CatalogCache(catalog, refresh_interval_s=3600)
    await cache.refresh()
    catalog.append("robots.rewards", rewards(10**6, 1))
    catalog.fail = True
    calls = catalog.calls

    async def recover() -> None:
        await asyncio.sleep(0.3)
        catalog.fail = False

    recovery = asyncio.create_task(recover())
    await catch_up(cache, {REWARDS: 2}, ADMIN, 5)
    await recovery
    assert behind(cache, {REWARDS: 2}, ADMIN) == []
    assert catalog.calls - calls >= 2  # failed at least once, then confirmed
