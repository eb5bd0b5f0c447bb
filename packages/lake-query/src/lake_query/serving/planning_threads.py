"""The threads that plan statements: bounded in time, shared fairly, watched for loss.

Planning runs DataFusion's parser and planner on a thread of this pool
(it blocks, and cannot be interrupted). Three bounds keep one statement,
or one tenant, from taking the replica:

- **a deadline** (``LAKE_QUERY_PLANNING_TIMEOUT_MS``) covers waiting for a
  thread and planning: at it the caller gets DEADLINE_EXCEEDED. A Python
  thread cannot be killed, so a thread still planning then is counted as
  *lost* until it ends on its own (the nesting guard,
  :mod:`lake_query.planning.nesting`, keeps the known endless forms from
  ever reaching the parser; this is the backstop);
- **a budget per tenant** (``LAKE_QUERY_PLANNING_THREADS_PER_TENANT``, lost
  threads included, always below the pool's size): one tenant's statements
  cannot occupy every thread;
- **health**: when every thread is lost, :meth:`PlanningThreads.serving`
  is False and the replica reports NOT_SERVING (see ``lake_query.cli``);
  new statements are refused at once as UNAVAILABLE. A lost thread that
  ends gives its capacity back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from lake_core import faults
from lake_core.config import QUERY_PLANNING_THREADS as PLANNING_THREADS
from lake_core.config import QUERY_PLANNING_THREADS_PER_TENANT as PLANNING_THREADS_PER_TENANT
from lake_core.config import QUERY_PLANNING_TIMEOUT_MS as PLANNING_TIMEOUT_MS
from lake_core.config import env_int
from lake_core.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from lake_core.planning_deadline import planning_until

__all__ = [
    "PLANNING_THREADS",
    "PLANNING_THREADS_PER_TENANT",
    "PLANNING_TIMEOUT_MS",
    "PlanningLimits",
    "PlanningThreads",
]

log = structlog.get_logger("lake_query.planning")

T = TypeVar("T")


def _default_threads() -> int:
    return max(8, 4 * (os.cpu_count() or 2))


@dataclass(frozen=True)
class PlanningLimits:
    """Planning's deadline and threads (see the module docstring)."""

    timeout_ms: int = 15_000
    threads: int = 8
    per_tenant: int = 4

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PlanningLimits:
        source = os.environ if env is None else env
        d = cls()
        return cls(
            timeout_ms=env_int(PLANNING_TIMEOUT_MS, d.timeout_ms, 10, 3_600_000, source),
            threads=env_int(PLANNING_THREADS, _default_threads(), 1, 1024, source),
            per_tenant=env_int(PLANNING_THREADS_PER_TENANT, d.per_tenant, 1, 1024, source),
        )

    @property
    def tenant_threads(self) -> int:
        """Threads one tenant may hold: never all of them when there are two or more."""
        return max(1, min(self.per_tenant, self.threads - 1))


class PlanningThreads:
    """A replica's planning pool (lives on one event loop; see the module docstring)."""

    def __init__(self, limits: PlanningLimits | None = None) -> None:
        self.limits = limits or PlanningLimits(threads=_default_threads())
        self._executor = ThreadPoolExecutor(
            max_workers=self.limits.threads, thread_name_prefix="lake-plan"
        )
        self._lock = threading.Lock()
        #: Threads past their deadline and still planning.
        self._lost = 0
        #: Planning threads held (waiting, running or lost) per tenant.
        self._held: dict[str, int] = {}
        self._freed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Called on the loop whenever :meth:`serving` may have changed.
        self.on_change: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"PlanningThreads(threads={self.limits.threads}, lost={self._lost})"

    @property
    def lost(self) -> int:
        return self._lost

    def serving(self) -> bool:
        """False when every planning thread is lost (the replica cannot plan)."""
        return self._lost < self.limits.threads

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def run(self, tenant: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a planning thread, within the deadline and ``tenant``'s budget."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        timeout_s = self.limits.timeout_ms / 1000
        deadline = loop.time() + timeout_s
        if not self.serving():
            raise Unavailable(
                "every planning thread of this replica is stuck past its deadline "
                f"({PLANNING_TIMEOUT_MS}); it reports NOT_SERVING: retry on another replica"
            )
        await self._take(tenant, deadline)
        started = time.monotonic()
        ends = started + max(0.0, deadline - loop.time())
        future: Future[T] = self._executor.submit(_planned, ends, fn, *args)
        wrapped = asyncio.wrap_future(future)
        try:
            result = await asyncio.wait_for(
                asyncio.shield(wrapped), max(0.0, deadline - loop.time())
            )
        except TimeoutError:
            # Nobody awaits the late outcome: retrieve it, so asyncio does not report it.
            wrapped.add_done_callback(_retrieve)
            if future.cancel():  # never started: nothing is lost
                self._give(tenant)
            else:
                self._lose(tenant, future)
                log.warning(
                    "planning past its deadline",
                    tenant=tenant,
                    timeout_ms=self.limits.timeout_ms,
                    lost_threads=self._lost,
                )
            raise DeadlineExceeded(
                f"planning the statement took longer than {self.limits.timeout_ms} ms "
                f"({PLANNING_TIMEOUT_MS}); simplify it"
            ) from None
        except BaseException:
            # Cancelled (the client went away): the thread's end gives the slot back.
            if future.cancel():
                self._give(tenant)
            else:
                future.add_done_callback(lambda _: self._give_threadsafe(tenant))
            raise
        self._give(tenant)
        log.debug("planned", seconds=round(time.monotonic() - started, 4))
        return result

    async def _take(self, tenant: str, deadline: float) -> None:
        """Hold one of ``tenant``'s planning slots, waiting until ``deadline`` at most."""
        assert self._loop is not None
        while True:
            with self._lock:
                held = self._held.get(tenant, 0)
                if held < self.limits.tenant_threads:
                    self._held[tenant] = held + 1
                    return
                if self._freed is None:
                    self._freed = asyncio.Event()
                freed = self._freed
            left = deadline - self._loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                await asyncio.wait_for(freed.wait(), left)
            except TimeoutError:
                raise ResourceExhausted(
                    f"this tenant already holds {self.limits.tenant_threads} planning threads "
                    f"({PLANNING_THREADS_PER_TENANT}); retry when its statements are planned"
                ) from None

    def _give(self, tenant: str) -> None:
        """Release one of ``tenant``'s slots (on the loop) and wake its waiters."""
        with self._lock:
            held = self._held.get(tenant, 0) - 1
            if held > 0:
                self._held[tenant] = held
            else:
                self._held.pop(tenant, None)
            freed, self._freed = self._freed, None
        if freed is not None:
            freed.set()

    def _give_threadsafe(self, tenant: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._give, tenant)

    def _lose(self, tenant: str, future: Future[Any]) -> None:
        """Count ``future``'s thread as lost until it ends (it keeps ``tenant``'s slot)."""
        with self._lock:
            self._lost += 1
        self._changed()

        def ended(_: Future[Any]) -> None:
            with self._lock:
                self._lost -= 1
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._recovered, tenant)

        future.add_done_callback(ended)

    def _recovered(self, tenant: str) -> None:
        log.info("a lost planning thread ended", tenant=tenant, lost_threads=self._lost)
        self._give(tenant)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _planned(ends: float, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` on a planning thread until ``ends`` (``time.monotonic()``), which
    its waits see (:mod:`lake_core.planning_deadline`); a test-only fault may
    make it slow first."""
    delay_ms = faults.setting(faults.QUERY_PLAN_DELAY_MS)
    if delay_ms:
        time.sleep(delay_ms / 1000)
    with planning_until(ends):
        return fn(*args)
