"""The replica's cache of current Iceberg snapshots, for planning only.

Bounds (per Query replica):

- at most ``capacity`` (10,000) completed entries, least recently used out;
- an entry is fresh for ``fresh_s`` (5 s) after its successful load;
- when a refresh fails, the last good entry still answers until ``last_good_s``
  (60 s) after its successful load; after that the load's error is raised;
- at most ``max_pending`` (64) distinct keys loading at once: a new key past
  that fails with :class:`~lake_core.errors.ResourceExhausted` before any I/O.

A cold or expired key is loaded once (single flight): concurrent callers wait
for the one load and get its result, stale-if-error answers included, and take
no pending slot of their own. The lock is never held across the load. If the
leading caller is interrupted (a ``BaseException``: cancellation, interpreter
shutdown), its waiters wake, see the load closed, and one of them leads a
replacement load.

DoGet never reads this cache: a ticket's snapshot is proved retained by a
fresh catalog load (:mod:`lake_iceberg.federation.provider`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from lake_core.errors import ResourceExhausted
from lake_iceberg.federation.counters import FederationCounters, NullCounters

__all__ = ["SnapshotCache"]

V = TypeVar("V")

CAPACITY = 10_000
FRESH_S = 5.0
LAST_GOOD_S = 60.0
MAX_PENDING = 64


@dataclass
class _Entry(Generic[V]):
    value: V
    loaded_at: float


@dataclass
class _Load(Generic[V]):
    done: threading.Event = field(default_factory=threading.Event)
    value: V | None = None
    error: BaseException | None = None
    abandoned: bool = False


class SnapshotCache(Generic[V]):
    """Bounded, single-flight, stale-if-error cache of loaded values by key."""

    def __init__(
        self,
        *,
        capacity: int = CAPACITY,
        fresh_s: float = FRESH_S,
        last_good_s: float = LAST_GOOD_S,
        max_pending: int = MAX_PENDING,
        clock: Callable[[], float] = time.monotonic,
        counters: FederationCounters | None = None,
    ) -> None:
        self.capacity = capacity
        self.fresh_s = fresh_s
        self.last_good_s = last_good_s
        self.max_pending = max_pending
        self._clock = clock
        self._counters = counters or NullCounters()
        self._entries: OrderedDict[Hashable, _Entry[V]] = OrderedDict()
        self._pending: dict[Hashable, _Load[V]] = {}
        self._waiting = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    @property
    def waiting(self) -> int:
        """Callers waiting on another caller's load now."""
        with self._lock:
            return self._waiting

    def get(self, key: Hashable, load: Callable[[], V]) -> V:
        """The fresh value for ``key``, loading it (once for all callers) when needed."""
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and self._clock() - entry.loaded_at < self.fresh_s:
                    self._entries.move_to_end(key)
                    self._counters.cache_hit()
                    return entry.value
                current = self._pending.get(key)
                leader = current is None
                if current is None:
                    if len(self._pending) >= self.max_pending:
                        raise ResourceExhausted(
                            f"{self.max_pending} Iceberg snapshot loads are already pending "
                            "on this replica; retry shortly"
                        )
                    current = self._pending[key] = _Load()
                    self._counters.cache_miss()
                else:
                    self._waiting += 1
            if leader:
                return self._lead(key, current, load)
            try:
                current.done.wait()
            finally:
                with self._lock:
                    self._waiting -= 1
            if current.abandoned:
                continue  # its leader is gone: one of the waiters leads anew
            if current.error is not None:
                raise current.error
            return current.value  # type: ignore[return-value]

    def _lead(self, key: Hashable, current: _Load[V], load: Callable[[], V]) -> V:
        try:
            value = load()
        except Exception as exc:
            self._counters.load_failure()
            with self._lock:
                del self._pending[key]
                stale = self._entries.get(key)
                if stale is not None and self._clock() - stale.loaded_at <= self.last_good_s:
                    current.value = stale.value
                else:
                    current.error = exc
            current.done.set()
            if current.error is not None:
                raise
            return stale.value  # type: ignore[union-attr]
        except BaseException:
            with self._lock:
                del self._pending[key]
                current.abandoned = True
            current.done.set()
            raise
        with self._lock:
            del self._pending[key]
            self._entries[key] = _Entry(value, self._clock())
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
            current.value = value
        current.done.set()
        return value
