"""Admission control for one Query replica: finite, fair, fail-closed.

A query takes its **tenant gate** (at most ``per_tenant`` running or queued
per tenant) and then a slot of the **global FIFO** (at most
``max_concurrent`` running), both under one absolute queue deadline. A noisy
tenant therefore cannot park more than its own share in the global queue,
and no request waits longer than ``queue_timeout_ms`` in total. Saturation
raises :class:`~lake_core.errors.ResourceExhausted`.

The :class:`Permit` owns both slots until it is released, exactly once:
:meth:`Admission.run` holds it for a whole DoGet stream and releases it on
completion, error, execution timeout (the stream ends with
DEADLINE_EXCEEDED), a stalled client (one that has not taken a message for
``stall_timeout_ms``, see :mod:`lake_query.serving.stall`), cancellation or client
disconnect.

The gates live on the event loop, but :meth:`Admission.try_acquire` may
take a permit from any thread when both gates have a free slot and nobody
waits (the native data plane's DoGet threads: no hop onto the loop for an
idle replica). One lock guards every change of the gates' counts, so the
limits and the FIFO order hold across threads; waiters are always woken on
the loop, by :meth:`Permit.release` there.

Tenant gates exist only while a request holds or waits for them: an idle
gate is removed synchronously on its last release. When ``max_tracked_tenants``
gates are active, a request from yet another tenant is refused rather than
growing the tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from lake_core import status
from lake_core.config import QUERY_EXECUTION_TIMEOUT_MS, QUERY_QUEUE_TIMEOUT_MS, env_int
from lake_core.config import QUERY_MAX_CONCURRENT as MAX_CONCURRENT
from lake_core.config import QUERY_MAX_CONCURRENT_PER_TENANT as MAX_CONCURRENT_PER_TENANT
from lake_core.config import QUERY_MAX_SQL_BYTES as MAX_SQL_BYTES
from lake_core.config import QUERY_MAX_TRACKED_TENANTS as MAX_TRACKED_TENANTS
from lake_core.errors import PermissionDenied, ResourceExhausted
from lake_core.telemetry import series
from lake_query.serving.stall import (
    DEFAULT_STALL_TIMEOUT_MS,
    STALL_TIMEOUT_MS,
    StallClock,
    watch_stalls,
)

__all__ = [
    "MAX_CONCURRENT",
    "MAX_CONCURRENT_PER_TENANT",
    "MAX_SQL_BYTES",
    "MAX_TRACKED_TENANTS",
    "QUERY_EXECUTION_TIMEOUT_MS",
    "QUERY_QUEUE_TIMEOUT_MS",
    "Admission",
    "AdmissionLimits",
    "Permit",
    "close_suspended",
    "replica_status",
]

log = structlog.get_logger("lake_query.admission")


_DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class AdmissionLimits:
    """Per-replica limits (see the module docstring)."""

    max_concurrent: int = 64
    per_tenant: int = 8
    max_tracked_tenants: int = 4096
    queue_timeout_ms: int = 100
    execution_timeout_ms: int = 30 * 60 * 1000
    max_sql_bytes: int = 1024 * 1024
    stall_timeout_ms: int = DEFAULT_STALL_TIMEOUT_MS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdmissionLimits:
        d = cls()
        return cls(
            max_concurrent=env_int(MAX_CONCURRENT, d.max_concurrent, 1, 100_000, env),
            per_tenant=env_int(MAX_CONCURRENT_PER_TENANT, d.per_tenant, 1, 100_000, env),
            max_tracked_tenants=env_int(
                MAX_TRACKED_TENANTS, d.max_tracked_tenants, 1, 1_000_000, env
            ),
            queue_timeout_ms=env_int(QUERY_QUEUE_TIMEOUT_MS, d.queue_timeout_ms, 0, _DAY_MS, env),
            execution_timeout_ms=env_int(
                QUERY_EXECUTION_TIMEOUT_MS, d.execution_timeout_ms, 1, 7 * _DAY_MS, env
            ),
            max_sql_bytes=env_int(MAX_SQL_BYTES, d.max_sql_bytes, 1024, 64 * 1024 * 1024, env),
            stall_timeout_ms=env_int(STALL_TIMEOUT_MS, d.stall_timeout_ms, 1, _DAY_MS, env),
        )


class _FifoGate:
    """A counting gate that hands freed slots to waiters strictly in arrival order."""

    def __init__(self, capacity: int, lock: threading.RLock) -> None:
        self.capacity = capacity
        self.held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._lock = lock  # the Admission's: shared by all its gates

    @property
    def idle(self) -> bool:
        return self.held == 0 and not self._waiters

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_take(self) -> bool:
        """Take a free slot if nobody waits for one (the caller holds the lock)."""
        if self.held < self.capacity and not self._waiters:
            self.held += 1
            return True
        return False

    async def acquire(self, deadline: float) -> bool:
        """Take a slot before ``deadline`` (loop time); False if it passed first."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.try_take():
                return True
            if deadline <= loop.time():
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
            return True
        except TimeoutError:
            return self._withdraw(waiter)
        except BaseException:
            if self._withdraw(waiter):
                self.release()
            raise

    def _withdraw(self, waiter: asyncio.Future[None]) -> bool:
        """Leave the queue; True if a slot was handed over meanwhile (keep it)."""
        with self._lock:
            if waiter.done() and not waiter.cancelled():
                return True
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            return False

    def release(self) -> None:
        """Free a slot or hand it to the first waiter (on the loop when anyone waits)."""
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot passes on: held is unchanged
                    return
            self.held -= 1


class Permit:
    """Both slots of one admitted query; :meth:`release` is idempotent."""

    def __init__(self, admission: Admission, tenant: str) -> None:
        self._admission = admission
        self._tenant = tenant
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """Release on the loop (which wakes a waiter, if any)."""
        with self._admission._lock:
            if self._released:
                return
            self._released = True
            self._admission._release(self._tenant)

    def release_if_unwaited(self) -> bool:
        """Release from any thread when nobody waits for either slot; False: not done.

        Waiters are woken on the loop only, so with one queued the caller
        hands :meth:`release` to the loop instead. A DoGet on the data plane
        thus ends without a wake-up of the loop on an uncontended replica.
        """
        with self._admission._lock:
            if self._released:
                return True
            if not self._admission._unwaited(self._tenant):
                return False
            self._released = True
            self._admission._release(self._tenant)
            return True


class Admission:
    """The replica's tenant gates and global FIFO."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        # Reentrant: a gate's own methods take it inside the Admission's sections.
        self._lock = threading.RLock()
        self._global = _FifoGate(limits.max_concurrent, self._lock)
        self._tenants: dict[str, _FifoGate] = {}
        self.refused = 0
        # Read at scrape time; the replica's one Admission (the latest built) reports.
        series.ADMISSION_RUNNING.set_function(lambda: self._global.held)
        series.ADMISSION_QUEUED.set_function(lambda: self._global.waiting)

    def __repr__(self) -> str:
        return f"Admission({self.limits})"

    @property
    def running(self) -> int:
        return self._global.held

    @property
    def tracked_tenants(self) -> int:
        return len(self._tenants)

    def waiting(self, tenant: str | None = None) -> int:
        """Callers queued now: in the global FIFO, or at ``tenant``'s own gate."""
        with self._lock:
            if tenant is None:
                return self._global.waiting
            gate = self._tenants.get(tenant)
            return 0 if gate is None else gate.waiting

    def _tenant_gate(self, tenant: str) -> _FifoGate:
        gate = self._tracked_gate(tenant)
        if gate is None:
            raise ResourceExhausted(
                "too many tenants have queries running on this Query replica; retry later"
            )
        return gate

    def _tracked_gate(self, tenant: str) -> _FifoGate | None:
        """``tenant``'s gate, created if the tracker has room; None if it is full."""
        with self._lock:
            gate = self._tenants.get(tenant)
            if gate is None:
                if len(self._tenants) >= self.limits.max_tracked_tenants:
                    return None
                gate = self._tenants[tenant] = _FifoGate(self.limits.per_tenant, self._lock)
            return gate

    def _prune(self, tenant: str, gate: _FifoGate) -> None:
        with self._lock:
            if gate.idle and self._tenants.get(tenant) is gate:
                del self._tenants[tenant]

    def try_acquire(self, tenant: str) -> Permit | None:
        """A permit now, from any thread, if both gates are free and nobody waits; else None.

        None is no refusal: the caller queues through :meth:`acquire` on the
        loop, which applies the deadline and refuses (a full tracker too).
        """
        with self._lock:
            gate = self._tracked_gate(tenant)
            if gate is None:
                return None
            if not gate.try_take():
                return None
            if not self._global.try_take():
                gate.held -= 1  # nobody can have queued behind it: the lock is held
                self._prune(tenant, gate)
                return None
            running, queued = self._global.held, self._global.waiting
        series.ADMITTED.inc()
        log.info("query admitted", running=running, queued=queued, waited_ms=0.0)
        return Permit(self, tenant)

    async def acquire(self, tenant: str) -> Permit:
        """Admit one query of ``tenant`` or raise ResourceExhausted by the queue deadline."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.limits.queue_timeout_ms / 1000
        try:
            gate = self._tenant_gate(tenant)
        except ResourceExhausted:
            self._refused("tracker", start)
            raise
        try:
            admitted = await gate.acquire(deadline)
        except BaseException:
            self._prune(tenant, gate)
            raise
        if not admitted:
            self._prune(tenant, gate)
            self._refused("tenant", start)
            raise ResourceExhausted(
                f"this tenant already has {self.limits.per_tenant} queries running or "
                "queued on this Query replica; retry later"
            )
        try:
            admitted = await self._global.acquire(deadline)
        except BaseException:
            gate.release()
            self._prune(tenant, gate)
            raise
        if not admitted:
            gate.release()
            self._prune(tenant, gate)
            self._refused("global", start)
            raise ResourceExhausted(
                f"this Query replica is running {self.limits.max_concurrent} queries; retry later"
            )
        series.ADMITTED.inc()
        log.info(
            "query admitted",
            running=self._global.held,
            queued=self._global.waiting,
            waited_ms=round((loop.time() - start) * 1000, 1),
        )
        return Permit(self, tenant)

    def _refused(self, gate: str, start: float) -> None:
        # No tenant id: logs may leave the deployment's trust boundary.
        waited = (asyncio.get_running_loop().time() - start) * 1000
        series.ADMISSION_REFUSED.inc(gate=gate)
        self.refused += 1
        log.info("query refused", gate=gate, waited_ms=round(waited, 1))

    def note_refused(self) -> None:
        """Count a refusal made past admission (the replica's query memory), in ``lake.status``."""
        with self._lock:
            self.refused += 1

    def _unwaited(self, tenant: str) -> bool:
        """Whether nobody waits at the global gate or ``tenant``'s (the lock is held)."""
        gate = self._tenants.get(tenant)
        return not self._global.waiting and (gate is None or not gate.waiting)

    def _release(self, tenant: str) -> None:
        with self._lock:
            self._global.release()
            gate = self._tenants.get(tenant)
            if gate is not None:
                gate.release()
                self._prune(tenant, gate)

    async def run(
        self,
        tenant: str,
        context: Any,
        start: Callable[[], Awaitable[AsyncIterator[bytes]]],
    ) -> AsyncIterator[bytes]:
        """Admit, then stream ``await start()`` under the execution deadline.

        ``context`` is the RPC's ``grpc.aio.ServicerContext``. At the deadline
        the stream ends with DEADLINE_EXCEEDED even when it is blocked on a
        slow client, and the permit is released.
        """
        permit = await self.acquire(tenant)
        task = asyncio.current_task()
        timeout_s = self.limits.execution_timeout_ms / 1000
        stream: AsyncIterator[bytes] | None = None

        async def end(message: str) -> None:
            permit.release()
            # The stream's own resources (a query's memory reservation, its producer
            # thread) go now too. Cancelling the RPC's task does not reach a stream
            # whose message waits in a blocked write: gRPC closes that generator only
            # when it drops the call, which a client that holds the stream open but
            # never reads delays indefinitely (with BDP probing as well).
            await close_suspended(stream)
            with contextlib.suppress(Exception):
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
            if task is not None and not task.done():
                task.cancel()

        async def expire() -> None:
            await asyncio.sleep(timeout_s)
            log.warning("query execution timed out", timeout_ms=self.limits.execution_timeout_ms)
            series.ADMISSION_TIMED_OUT.inc()
            await end(
                f"query exceeded the execution timeout of {self.limits.execution_timeout_ms} ms"
            )

        async def stalled() -> None:
            log.warning("query client stalled", stall_timeout_ms=self.limits.stall_timeout_ms)
            series.ADMISSION_STALLED.inc()
            await end(
                f"the client took no result message for {self.limits.stall_timeout_ms} ms "
                f"({STALL_TIMEOUT_MS})"
            )

        clock = StallClock()
        watchdogs = (
            asyncio.create_task(expire()),
            asyncio.create_task(watch_stalls(clock, self.limits.stall_timeout_ms, stalled)),
        )
        try:
            stream = await start()
            async with contextlib.aclosing(stream):
                async for message in stream:
                    # grpc.aio resumes this generator once the message is written,
                    # which flow control holds up while the client is not reading.
                    clock.offered()
                    series.STREAMED_BYTES.inc(len(message))
                    yield message
                    clock.taken()
        finally:
            for watchdog in watchdogs:
                watchdog.cancel()
            permit.release()


async def close_suspended(stream: AsyncIterator[bytes] | None) -> None:
    """Close ``stream`` if it is suspended at a ``yield``; one running now is left alone.

    A running stream is inside an ``await`` of the task being cancelled, so
    the cancellation runs its ``finally`` instead.
    """
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    # RuntimeError: "asynchronous generator is already running"; any other error
    # of its cleanup must not keep the caller from ending the call.
    with contextlib.suppress(Exception):
        await aclose()


def replica_status(admission: Admission | None, cache: Any, principal: Any) -> status.QueryStatus:
    """``lake.status`` of this replica (admins only): admission figures and version."""
    if getattr(principal, "role", None) != "admin":
        raise PermissionDenied("lake.status needs an admin principal")
    limits = admission.limits if admission is not None else AdmissionLimits()
    return status.QueryStatus(
        admission=status.AdmissionStatus(
            running=admission.running if admission is not None else 0,
            queued=admission._global.waiting if admission is not None else 0,
            tracked_tenants=admission.tracked_tenants if admission is not None else 0,
            max_concurrent=limits.max_concurrent,
            per_tenant=limits.per_tenant,
            refused_total=admission.refused if admission is not None else 0,
        ),
        catalog_generation=getattr(cache, "generation", None),
        version=status.lake_version(),
    )
