"""The replica's DataFusion memory, handed out one query pool at a time, fairly.

DataFusion's Python API builds a fresh ``RuntimeEnv`` (and memory pool)
for every ``SessionContext``: one pool cannot be shared across sessions.
So each executing query gets its own pool of ``query_memory_bytes``
(``LAKE_QUERY_MEMORY_LIMIT_BYTES`` / 4), and reserves that many bytes of
the replica's ``LAKE_QUERY_MEMORY_LIMIT_BYTES`` before its session exists;
the reservation is released when its result stream ends (completion, error,
the client gone, or a stalled client: :mod:`lake_query.stall`). The sum of
the pools of the queries running at once therefore never exceeds the
replica's limit (by default 2 GiB, four 512 MiB pools, for a 2-core 4 GiB
replica).

One tenant's queries hold at most ``tenant_bytes`` of it at once
(``LAKE_QUERY_MEMORY_POOLS_PER_TENANT`` pools, two of four by default), so
a tenant's long or stalled queries never keep every other tenant out. A
query that finds no room (the replica's memory, or its tenant's share)
waits up to the admission queue deadline (``LAKE_QUERY_QUEUE_TIMEOUT_MS``)
and is then refused with a retryable
:class:`~lake_core.errors.ResourceExhausted`, counted in
``lake_query_admission_refused_total`` (gates ``memory`` and
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

    def __init__(self, budget: MemoryBudget, nbytes: int, tenant: str | None = None) -> None:
        self._budget: MemoryBudget | None = budget
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
    """A replica's DataFusion memory limit, reserved whole pools at a time (blocking).

    ``tenant_bytes``: the most one tenant may hold at once (None: no share
    per tenant). ``on_refused``: told of every refusal (the admission's
    count, which ``lake.status`` reports).
    """

    def __init__(
        self,
        total_bytes: int,
        wait_s: float,
        tenant_bytes: int | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self.total_bytes = total_bytes
        self.tenant_bytes = total_bytes if tenant_bytes is None else min(tenant_bytes, total_bytes)
        self.on_refused = on_refused
        self._wait_s = wait_s
        self._free = total_bytes
        self._held: dict[str, int] = {}
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
            return self._held.get(tenant, 0)

    def reserve(self, nbytes: int, tenant: str | None = None) -> Reservation:
        """Take ``nbytes`` (at most one tenant's share) for ``tenant``, waiting up to the deadline.

        ``tenant`` None: reserved outside any tenant's share (tests, tools).
        """
        nbytes = min(nbytes, self.total_bytes if tenant is None else self.tenant_bytes)
        deadline = time.monotonic() + self._wait_s
        with self._changed:
            while True:
                over_share = tenant is not None and (
                    self._held.get(tenant, 0) + nbytes > self.tenant_bytes
                )
                if self._free >= nbytes and not over_share:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    # The tenant's share is named only when it alone kept the query out.
                    raise self._refuse(over_share and self._free >= nbytes)
                self._changed.wait(left)
            self._free -= nbytes
            if tenant is not None and nbytes:
                self._held[tenant] = self._held.get(tenant, 0) + nbytes
        return Reservation(self, nbytes, tenant)

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
            if tenant is not None and nbytes:
                left = self._held.get(tenant, 0) - nbytes
                if left > 0:
                    self._held[tenant] = left
                else:
                    self._held.pop(tenant, None)
            self._changed.notify_all()
