"""The replica's elastic query memory: every admitted query gets a pool at once, fairly.

The budget's promises, checked over generated sequences of reservations and
releases against its own bookkeeping: no pool is smaller than the floor or
larger than asked, the pools never add up past the replica's limit or a
tenant past its share, and while admission's slots bound the queries, a
query never waits.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from lake_core.errors import ResourceExhausted
from lake_query.planning.reservations import MemoryBudget, Reservation

MiB = 1 << 20
GiB = 1 << 30


def defaults(wait_s: float = 0.0) -> MemoryBudget:
    """The replica's defaults: 2 GiB, 512 MiB pools, two pools per tenant, 64/8 slots."""
    return MemoryBudget(2 * GiB, wait_s, tenant_bytes=1 * GiB, slots=64, tenant_slots=8)


def test_an_idle_replica_gives_a_query_its_full_pool() -> None:
    budget = defaults()
    assert budget.floor == 16 * MiB
    held = budget.reserve(512 * MiB, "acme")
    assert held.nbytes == 512 * MiB
    held.release()
    assert budget.reserved == 0


def test_a_tenant_runs_every_query_admission_lets_in_within_its_share() -> None:
    budget = defaults()
    pools = [budget.reserve(512 * MiB, "acme") for _ in range(8)]
    sizes = [p.nbytes for p in pools]
    assert sizes[0] == 512 * MiB  # the first gets the full pool ...
    assert all(size >= budget.floor for size in sizes)  # ... and every one a pool
    assert sum(sizes) <= budget.tenant_bytes
    # Another tenant's query still gets a pool at once: acme holds only its share ...
    other = budget.reserve(512 * MiB, "globex")
    assert other.nbytes >= budget.floor
    for pool in pools:
        pool.release()
    # ... and its next one a full pool, once acme's are back.
    assert budget.reserve(512 * MiB, "globex").nbytes == 512 * MiB
    other.release()
    assert budget.reserved == 0
    assert budget.held_by("acme") == 0


def test_64_queries_of_8_tenants_all_get_pools_at_once() -> None:
    budget = defaults()
    pools = [budget.reserve(512 * MiB, f"tenant-{i % 8}") for i in range(64)]
    assert all(p.nbytes >= budget.floor for p in pools)
    assert budget.reserved <= budget.total_bytes
    for pool in pools:
        pool.release()
    assert budget.reserved == 0


def test_beyond_admissions_slots_a_query_waits_then_is_refused_retryable() -> None:
    refused: list[int] = []
    budget = MemoryBudget(
        64 * MiB, 0.05, slots=2, tenant_slots=2, on_refused=lambda: refused.append(1)
    )
    first = budget.reserve(32 * MiB, None)
    second = budget.reserve(32 * MiB, None)
    assert first.nbytes + second.nbytes == 64 * MiB
    with pytest.raises(ResourceExhausted, match="LAKE_QUERY_MEMORY_LIMIT_BYTES") as busy:
        budget.reserve(32 * MiB, None)
    assert busy.value.retryable is True
    assert refused == [1]
    first.release()
    second.release()
    assert budget.reserved == 0


def test_a_query_waiting_for_memory_gets_in_when_a_pool_is_released() -> None:
    budget = MemoryBudget(64 * MiB, 60.0, slots=1, tenant_slots=1)
    first = budget.reserve(64 * MiB, None)
    threading.Timer(0.05, first.release).start()
    second = budget.reserve(64 * MiB, None)  # waits (well within its 60 s) for the release
    assert second.nbytes == 64 * MiB
    second.release()
    assert budget.reserved == 0


def test_a_tenant_past_its_share_is_refused_naming_the_share() -> None:
    budget = MemoryBudget(64 * MiB, 0.0, tenant_bytes=16 * MiB, slots=4, tenant_slots=1)
    held = budget.reserve(16 * MiB, "acme")
    assert held.nbytes == 16 * MiB
    with pytest.raises(ResourceExhausted, match="LAKE_QUERY_MEMORY_POOLS_PER_TENANT"):
        budget.reserve(16 * MiB, "acme")
    assert budget.reserve(16 * MiB, "globex").nbytes == 16 * MiB


def test_nothing_asked_holds_nothing() -> None:
    budget = defaults()
    none = budget.reserve(0, "acme")
    assert none.nbytes == 0
    none.release()
    none.release()
    assert budget.reserved == 0
    assert budget.reserve(512 * MiB, "acme").nbytes == 512 * MiB


@pytest.mark.parametrize("seed", range(40))
def test_generated_reservations_keep_every_promise(seed: int) -> None:
    """Any mix of pool sizes and tenants, as admission lets them in: never a wait."""
    rng = random.Random(seed)
    total = rng.choice([16 * MiB, 256 * MiB, 2 * GiB])
    slots = rng.randint(1, 64)
    tenant_slots = rng.randint(1, slots)
    budget = MemoryBudget(
        total,
        0.0,  # no wait: a query that does not get memory at once fails the test
        tenant_bytes=rng.randint(1, 4) * (total // 4),
        slots=slots,
        tenant_slots=tenant_slots,
    )
    live: list[Reservation] = []
    for _ in range(600):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live))).release()
            continue
        tenant = rng.choice(["a", "b", "c", None])
        if len(live) >= slots or (
            tenant is not None and sum(p.tenant == tenant for p in live) >= tenant_slots
        ):
            continue  # admission would not let it in
        want = rng.choice([total // 4, total // 64, 1])
        pool = budget.reserve(want, tenant)
        assert budget.floor <= pool.nbytes <= max(want, budget.floor)
        live.append(pool)
        assert budget.reserved == sum(p.nbytes for p in live) <= total
        for name in ("a", "b", "c"):
            held = sum(p.nbytes for p in live if p.tenant == name)
            assert budget.held_by(name) == held <= budget.tenant_bytes
    for pool in live:
        pool.release()
    assert budget.reserved == 0


@pytest.mark.parametrize("seed", range(20))
def test_beyond_admission_pools_never_overcommit(seed: int) -> None:
    """More queries than the slots (work admission does not bound): refusals, never more."""
    rng = random.Random(seed)
    budget = MemoryBudget(64 * MiB, 0.0, tenant_bytes=32 * MiB, slots=4, tenant_slots=2)
    live: list[Reservation] = []
    for _ in range(400):
        if live and rng.random() < 0.3:
            live.pop(rng.randrange(len(live))).release()
            continue
        tenant = rng.choice(["a", "b", None])
        try:
            live.append(budget.reserve(rng.choice([16 * MiB, 1 * MiB]), tenant))
        except ResourceExhausted:
            assert len(live) >= 2  # at least one other query holds memory
        assert budget.reserved == sum(p.nbytes for p in live) <= budget.total_bytes
        assert budget.held_by("a") <= budget.tenant_bytes
    for pool in live:
        pool.release()
    assert budget.reserved == 0


def test_concurrent_reservations_never_overcommit() -> None:
    budget = MemoryBudget(256 * MiB, 1.0, tenant_bytes=128 * MiB, slots=16, tenant_slots=8)
    peak = [0]
    lock = threading.Lock()

    def run(tenant: str) -> None:
        for _ in range(50):
            pool = budget.reserve(64 * MiB, tenant)
            with lock:
                peak[0] = max(peak[0], budget.reserved)
            assert budget.held_by(tenant) <= budget.tenant_bytes
            time.sleep(0)
            pool.release()

    threads = [threading.Thread(target=run, args=(f"t{i % 4}",)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 0 < peak[0] <= budget.total_bytes
    assert budget.reserved == 0
