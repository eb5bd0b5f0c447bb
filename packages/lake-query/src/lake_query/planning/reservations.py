"""The replica's DataFusion memory, handed out to queries in elastic pools, fairly.

DataFusion's Python API builds a fresh ``RuntimeEnv`` (and memory pool)
for every ``SessionContext``: one pool cannot be shared across sessions.
So each executing query gets a pool of its own, reserved from the
replica's ``LAKE_QUERY_MEMORY_LIMIT_BYTES`` before its session exists and
released when its result stream ends (completion, error, the client gone,
or a stalled client: :mod:`lake_query.serving.stall`). The sum of the pools of the
queries running at once never exceeds the replica's limit.

Pools are elastic. A query asks for ``query_memory_bytes``
(``LAKE_QUERY_MEMORY_LIMIT_BYTES`` / 4) and gets it while the replica has
room; when other queries hold the memory it gets a smaller pool (its sorts,
joins and aggregates spill sooner), never less than the *floor*. Each grant
keeps back a floor for every other query admission may still let in
(``LAKE_QUERY_MAX_CONCURRENT`` on the replica,
``LAKE_QUERY_MAX_CONCURRENT_PER_TENANT`` in each tenant's share), and the
floors of all of them fit in half the memory (16 MiB of the default 2 GiB
for 64 queries), so a statement that admission admits always gets memory at
once: a fleet's dashboards and training reads are never refused because of
memory that other queries hold, nor kept out by another tenant's long or
stalled queries. A query that fails for want of memory in a pool smaller
than the full one is refused as retryable (the replica was busy), not as
too large.

One tenant's queries hold at most ``tenant_bytes`` at once
(``LAKE_QUERY_MEMORY_POOLS_PER_TENANT`` full pools, two of four by
default). A query that finds less than its floor (only possible for work
admission does not bound, such as durable async jobs) waits up to the
admission queue deadline (``LAKE_QUERY_QUEUE_TIMEOUT_MS``) and is then
refused with a retryable :class:`~lake_core.errors.ResourceExhausted`,
counted in ``lake_query_admission_refused_total`` (gates ``memory`` and
``tenant_memory``) like admission's own refusals. Direct Lance scans run no
DataFusion operator and reserve nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from lake_core.config import QUERY_MEMORY_LIMIT_BYTES as MEMORY_LIMIT_BYTES
from lake_core.config import QUERY_MEMORY_POOLS_PER_TENANT as POOLS_PER_TENANT
from lake_core.errors import ResourceExhausted
from lake_core.telemetry import series

__all__ = ["MemoryBudget", "Reservation"]

log = structlog.get_logger("lake_query.admission")


class Reservation:
    """Bytes of a :class:`MemoryBudget` held by one query, released exactly once."""

    def __init__(self, budget: MemoryBudget | None, nbytes: int, tenant: str | None = None) -> None:
        self._budget = budget
        self.nbytes = nbytes
        self.tenant = tenant

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._give_back(self.nbytes, self.tenant)

    def __del__(self) -> None:
        # A stream dropped without close() must not leak the replica's memory.
        self.release()


class MemoryBudget:
    """A replica's DataFusion memory limit, reserved in elastic pools (blocking).

    ``tenant_bytes``: the most one tenant may hold at once (None: no share
    per tenant). ``on_refused``: told of every refusal (the admission's
    count, which ``lake.status`` reports). ``slots``/``tenant_slots``: how
    many queries admission runs at once on the replica and per tenant; each
    grant leaves a floor for every one of them.
    """

    def __init__(
        self,
        total_bytes: int,
        wait_s: float,
        tenant_bytes: int | None = None,
        on_refused: Callable[[], None] | None = None,
        *,
        slots: int = 1,
        tenant_slots: int = 1,
    ) -> None:
        self.total_bytes = total_bytes
        self.tenant_bytes = total_bytes if tenant_bytes is None else min(tenant_bytes, total_bytes)
        self.on_refused = on_refused
        #: Queries admission lets run at once, on the replica and per tenant.
        self.slots = max(1, slots)
        self.tenant_slots = max(1, min(tenant_slots, self.slots))
        #: The least pool a query gets: every admitted query can have it at once, in
        #: half of the memory (the other half is for pools larger than the floor).
        self.floor = max(
            1, min(total_bytes // (2 * self.slots), self.tenant_bytes // (2 * self.tenant_slots))
        )
        self._wait_s = wait_s
        self._free = total_bytes
        self._running = 0
        self._held: dict[str, tuple[int, int]] = {}  # tenant: (bytes, queries)
        # Re-entrant: a Reservation's finalizer may run on a thread inside reserve().
        self._changed = threading.Condition(threading.RLock())

    def __repr__(self) -> str:
        return f"MemoryBudget(free={self._free}, total={self.total_bytes})"

    @property
    def reserved(self) -> int:
        with self._changed:
            return self.total_bytes - self._free

    def held_by(self, tenant: str) -> int:
        """Bytes ``tenant``'s queries hold now."""
        with self._changed:
            return self._held.get(tenant, (0, 0))[0]

    def reserve(self, nbytes: int, tenant: str | None = None) -> Reservation:
        """A pool of up to ``nbytes`` (at least the floor) for ``tenant``, waiting up to the deadline.

        ``tenant`` None: reserved outside any tenant's share (tests, tools).
        ``nbytes`` 0 reserves nothing (the guards are off).
        """
        if nbytes <= 0:
            return Reservation(None, 0, tenant)
        # Never less than a floor: what each grant keeps back for others assumes it.
        nbytes = max(nbytes, self.floor)
        deadline = time.monotonic() + self._wait_s
        with self._changed:
            while True:
                granted, over_share = self._grant(nbytes, tenant)
                if granted:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    # The tenant's share is named only when it alone kept the query out.
                    raise self._refuse(over_share)
                self._changed.wait(left)
            self._free -= granted
            self._running += 1
            if tenant is not None:
                held, queries = self._held.get(tenant, (0, 0))
                self._held[tenant] = (held + granted, queries + 1)
        return Reservation(self, granted, tenant)

    def _grant(self, want: int, tenant: str | None) -> tuple[int, bool]:
        """The pool a query gets now (0: none), and whether only its tenant's share is full.

        At most ``want``, and what leaves a floor for each other query that
        admission may still let in, on the replica and in the tenant's share.
        """
        floor = self.floor
        others = max(0, self.slots - self._running - 1)
        room = self._free - others * self.floor
        if room < floor:  # more queries than admission's slots: what is free, if a floor
            room = self._free
        if room < floor:
            return 0, False
        if tenant is None:
            return min(want, room), False
        held, queries = self._held.get(tenant, (0, 0))
        share = self.tenant_bytes - held
        tenant_room = share - max(0, self.tenant_slots - queries - 1) * self.floor
        if tenant_room < floor:
            tenant_room = share
        if tenant_room < floor:
            return 0, True
        return min(want, room, tenant_room), False

    def _refuse(self, over_share: bool) -> ResourceExhausted:
        # No tenant id: logs may leave the deployment's trust boundary.
        gate = "tenant_memory" if over_share else "memory"
        series.ADMISSION_REFUSED.inc(gate=gate)
        if self.on_refused is not None:
            self.on_refused()
        log.info("query refused", gate=gate, waited_ms=round(self._wait_s * 1000, 1))
        if over_share:
            return ResourceExhausted(
                "this tenant's queries hold its share of this replica's query memory "
                f"({POOLS_PER_TENANT} of the pools of {MEMORY_LIMIT_BYTES}); retry shortly"
            )
        return ResourceExhausted(
            f"this replica's query memory ({MEMORY_LIMIT_BYTES}) is in use by other queries; "
            "retry shortly"
        )

    def _give_back(self, nbytes: int, tenant: str | None) -> None:
        with self._changed:
            self._free += nbytes
            self._running -= 1
            if tenant is not None:
                held, queries = self._held.get(tenant, (0, 0))
                if queries > 1:
                    self._held[tenant] = (held - nbytes, queries - 1)
                else:
                    self._held.pop(tenant, None)
            self._changed.notify_all()
