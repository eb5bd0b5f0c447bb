"""The replica's DataFusion memory, handed out one query pool at a time.

DataFusion's Python API builds a fresh ``RuntimeEnv`` (and memory pool)
for every ``SessionContext``: one pool cannot be shared across sessions.
So each executing query gets its own pool of ``query_memory_bytes``
(``LAKE_QUERY_MEMORY_LIMIT_BYTES`` / 4), and reserves that many bytes of
the replica's ``LAKE_QUERY_MEMORY_LIMIT_BYTES`` before its session exists;
the reservation is released when its result stream ends. The sum of the
pools of the queries running at once therefore never exceeds the replica's
limit (by default 2 GiB, four 512 MiB pools, for a 2-core 4 GiB replica).
A query that finds no room waits up to the admission queue deadline
(``LAKE_QUERY_QUEUE_TIMEOUT_MS``) and is then refused with a retryable
:class:`~lake_core.errors.ResourceExhausted`. Direct Lance scans run no
DataFusion operator and reserve nothing.
"""

from __future__ import annotations

import threading
import time

from lake_core.errors import ResourceExhausted

__all__ = ["MemoryBudget", "Reservation"]


class Reservation:
    """Bytes of a :class:`MemoryBudget` held by one query, released exactly once."""

    def __init__(self, budget: MemoryBudget, nbytes: int) -> None:
        self._budget: MemoryBudget | None = budget
        self.nbytes = nbytes

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._give_back(self.nbytes)

    def __del__(self) -> None:
        # A stream dropped without close() must not leak the replica's memory.
        self.release()


class MemoryBudget:
    """A replica's DataFusion memory limit, reserved whole pools at a time (blocking)."""

    def __init__(self, total_bytes: int, wait_s: float) -> None:
        self.total_bytes = total_bytes
        self._wait_s = wait_s
        self._free = total_bytes
        # Re-entrant: a Reservation's finalizer may run on a thread inside reserve().
        self._changed = threading.Condition(threading.RLock())

    def __repr__(self) -> str:
        return f"MemoryBudget(free={self._free}, total={self.total_bytes})"

    @property
    def reserved(self) -> int:
        with self._changed:
            return self.total_bytes - self._free

    def reserve(self, nbytes: int) -> Reservation:
        """Take ``nbytes`` (at most the whole budget), waiting up to the deadline."""
        nbytes = min(nbytes, self.total_bytes)
        deadline = time.monotonic() + self._wait_s
        with self._changed:
            while self._free < nbytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ResourceExhausted(
                        "this replica's query memory (LAKE_QUERY_MEMORY_LIMIT_BYTES) is "
                        "in use by other queries; retry shortly"
                    )
                self._changed.wait(left)
            self._free -= nbytes
        return Reservation(self, nbytes)

    def _give_back(self, nbytes: int) -> None:
        with self._changed:
            self._free += nbytes
            self._changed.notify_all()
