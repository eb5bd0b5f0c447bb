"""The async worker pool of one replica: scan, claim under a lease, run, publish.

The scheduler pages through the active-job index (bounded pages), groups
eligible jobs (pending, or running under an expired lease: its worker died)
by tenant (its key under the active ticket key, from the sealed body: a job
stores its sealing key's, and a rotation gives one tenant two) and takes
them round-robin across tenants, one tenant at a time, skipping a tenant
that is at its per-tenant limit instead of holding a slot for it. A claim is
a compare-and-swap of the job record that sets a fresh lease token; the
worker renews it (and the fleet execution lease) while it runs and gives up
as soon as a renewal fails: another replica owns the job now. A transient
shortage (RESOURCE_EXHAUSTED or UNAVAILABLE, retryable: the replica's query
memory taken, Metasrv failing over) is not a verdict: the worker drops the
attempt's parts and runs the job again with backoff, within the job's
execution timeout, which alone can fail it then. Parts go under
``<job>/<attempt>/``; the manifest is written once after the last part, then
the record moves to ``done`` naming it, so no manifest names a partial
result and no reader sees one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import structlog
from opentelemetry import trace

from lake_core import faults
from lake_core.errors import (
    DeadlineExceeded,
    Internal,
    LakeError,
    QueryCancelled,
    ResourceExhausted,
    Unavailable,
)
from lake_core.principal import Principal
from lake_core.schemas import schema_from_base64
from lake_core.telemetry.tracing import resumed_span
from lake_query.jobs.model import JobRecord, JobSeal, ResultManifest
from lake_query.jobs.parts import write_parts
from lake_query.jobs.quotas import ExecutionLease, TenantSlots
from lake_query.jobs.results import ResultStore
from lake_query.jobs.settings import AsyncSettings
from lake_query.jobs.store import ACTIVE, JOBS, StateStore
from lake_query.planning import QuerySpec

__all__ = ["JOB_SPAN", "RETRY_BACKOFF_S", "SCAN_PAGE", "Jobs", "WorkerPool", "transient"]

log = structlog.get_logger("lake_query.jobs")

#: Active-index keys read per scan page.
SCAN_PAGE = 64
#: Idle scan interval (a submission on this replica wakes the scheduler at once).
SCAN_INTERVAL_S = 0.25
#: Jobs whose tenant keys the scheduler remembers (cleared when full).
TENANT_CACHE = 4096
#: How often a replica deletes jobs past their retention.
SWEEP_INTERVAL_S = 60.0
#: The span of one attempt at running a job (no workload identity in name or attributes).
JOB_SPAN = "lake.async_query.execute"

#: First and longest wait before running a job again after a transient error, seconds.
RETRY_BACKOFF_S = (0.1, 5.0)

Execute = Callable[[QuerySpec, Principal], Any]


def transient(error: LakeError) -> bool:
    """A shortage that passes (the replica's memory, Metasrv failing over): retry the job.

    Bounds a query passes (``QueryTooLarge``, ``ResultTooLarge``) are verdicts:
    they are not retryable, so the job fails with them.
    """
    return isinstance(error, ResourceExhausted | Unavailable) and error.retryable


class _Stop(threading.Event):
    """A job's stop event; setting it also runs its hooks (aborting the running batch)."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def on_set(self, hook: Callable[[], None]) -> None:
        with self._hooks_lock:
            if not self.is_set():
                self._hooks.append(hook)
                return
        hook()

    def set(self) -> None:
        with self._hooks_lock:
            super().set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()


class Jobs:
    """Record reads and compare-and-swap writes shared by the service and the workers."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        #: Per job some poll waits on: set (and dropped) when this process next writes its record.
        self._written: dict[str, asyncio.Event] = {}

    async def get(self, job_id: str) -> tuple[JobRecord, int] | None:
        found = await self.store.read(JOBS, job_id)
        if found is None:
            return None
        return JobRecord.model_validate(found[0]), found[1]

    async def swap(self, record: JobRecord, revision: int, new: JobRecord) -> bool:
        written = await self.store.write(JOBS, record.job_id, new.model_dump(mode="json"), revision)
        if written:
            event = self._written.pop(record.job_id, None)
            if event is not None:
                event.set()
        return written

    async def written(self, job_id: str, timeout_s: float) -> None:
        """Return once this process writes the job's record again, or after ``timeout_s``.

        Only this process's writes wake it (a worker here finishing the job);
        a record another replica writes is seen by reading it again, which
        the caller does when this returns either way.
        """
        event = self._written.setdefault(job_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            # Timed out or cancelled (the caller hung up): no entry outlives its waiters for
            # long. Another waiter of the same event then wakes at its own timeout and reads.
            if self._written.get(job_id) is event and not event.is_set():
                del self._written[job_id]

    async def update(
        self, job_id: str, change: Callable[[JobRecord], JobRecord | None]
    ) -> JobRecord | None:
        """Apply ``change`` under CAS until it sticks; None if the job is gone or unchanged."""
        for _ in range(64):
            found = await self.get(job_id)
            if found is None:
                return None
            new = change(found[0])
            if new is None:
                return found[0]
            if await self.swap(found[0], found[1], new):
                return new
        raise Internal("the async job record is contended")


class WorkerPool:
    def __init__(
        self,
        settings: AsyncSettings,
        jobs: Jobs,
        results: ResultStore,
        seal: JobSeal,
        slots: TenantSlots,
        execute: Execute,
    ) -> None:
        self._settings = settings
        self._jobs = jobs
        self._results = results
        self._seal = seal
        self._slots = slots
        self._execute = execute
        self.owner = secrets.token_hex(8)
        self._fleet = (
            ExecutionLease(
                jobs.store,
                settings.global_concurrency,
                settings.global_concurrency_per_tenant or settings.global_concurrency,
                settings.lease_ms / 1000,
            )
            if settings.global_concurrency
            else None
        )
        # Per job: the query executing, the encoder, the store's writer (or the wait
        # for the next part), and a part still being synced. Enough that no job
        # waits for a thread.
        self._threads = ThreadPoolExecutor(
            max_workers=4 * settings.worker_concurrency, thread_name_prefix="lake-async"
        )
        self._running: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._tenants: dict[tuple[str, float], list[str]] = {}
        self._stops: dict[str, _Stop] = {}
        self._wake = asyncio.Event()
        self._rotation = 0
        self._task: asyncio.Task[None] | None = None
        # Test-only (faults.ASYNC_FAIL_PART): which part this process fails, and its count.
        self._fail_part = faults.active().setting(faults.ASYNC_FAIL_PART)
        self._parts_begun = itertools.count(1)

    def __repr__(self) -> str:
        return f"WorkerPool(owner={self.owner}, running={len(self._running)})"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._schedule())

    def wake(self) -> None:
        self._wake.set()

    def interrupt(self, job_id: str) -> None:
        """Stop a job this replica runs now (cancelled here; other replicas see it on renewal)."""
        stop = self._stops.get(job_id)
        if stop is not None:
            stop.set()

    async def close(self) -> None:
        tasks = [t for _, t in self._running.values()]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._threads.shutdown(wait=False, cancel_futures=True)

    # Scheduling.

    async def _schedule(self) -> None:
        sweep_at = 0.0
        while True:
            try:
                await self._scan()
                if time.monotonic() >= sweep_at:
                    sweep_at = time.monotonic() + SWEEP_INTERVAL_S
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store was unreachable: try again next round
                log.warning("async scan failed", error_type=type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SCAN_INTERVAL_S):
                    await self._wake.wait()
            self._wake.clear()

    async def sweep(self, now: float | None = None) -> int:
        """Delete jobs past their retention (record, results, slot), a bounded page at a time.

        Any replica may sweep; a concurrent sweep of the same job only finds it gone.
        """
        removed = 0
        after: str | None = None
        moment = time.time() if now is None else now
        while True:
            keys = await self._jobs.store.keys(JOBS, after, SCAN_PAGE)
            for job_id in keys:
                found = await self._jobs.get(job_id)
                if found is None or not found[0].expired(moment) or job_id in self._running:
                    continue
                record, revision = found
                if record.state == "running" and record.lease_expires > moment:
                    continue  # a live worker's job: its own deadline ends it first
                await self._jobs.store.remove(ACTIVE, job_id)
                await self._results.delete_prefix(job_id)
                if await self._jobs.store.remove(JOBS, job_id, revision):
                    await self._slots.release(record.tenant_key, job_id)
                    removed += 1
            if len(keys) < SCAN_PAGE:
                return removed
            after = keys[-1]

    def _free(self) -> int:
        return self._settings.worker_concurrency - len(self._running)

    def _tenant_keys(self, record: JobRecord) -> list[str]:
        """:meth:`JobSeal.tenant_keys_of`, opened once per job (about 25 us each).

        A waiting job is seen by every scan (four a second); its sealed body
        never changes, and the submission time tells a reused id apart.
        """
        key = (record.job_id, record.submitted_at)
        found = self._tenants.get(key)
        if found is None:
            if len(self._tenants) >= TENANT_CACHE:
                self._tenants.clear()
            found = self._tenants[key] = self._seal.tenant_keys_of(record)
        return found

    def _busy(self, tenant_key: str) -> int:
        return sum(1 for tenant, _ in self._running.values() if tenant == tenant_key)

    async def _scan(self) -> None:
        after: str | None = None
        while self._free() > 0:
            keys = await self._jobs.store.keys(ACTIVE, after, SCAN_PAGE)
            if not keys:
                return
            after = keys[-1]
            by_tenant: dict[str, list[tuple[JobRecord, int, list[str]]]] = defaultdict(list)
            now = time.time()
            for job_id in keys:
                if job_id in self._running:
                    continue
                found = await self._jobs.get(job_id)
                if found is None:
                    continue
                record = found[0]
                if record.terminal:
                    await self._jobs.store.remove(ACTIVE, job_id)
                elif record.state == "pending" or record.lease_expires < now:
                    # Grouped by the tenant's active-key digest, not the stored one:
                    # during a key rotation one tenant's jobs are stored under two.
                    tenant_keys = self._tenant_keys(record)
                    by_tenant[tenant_keys[0]].append((*found, tenant_keys))
            await self._dispatch(by_tenant)
            if len(keys) < SCAN_PAGE:
                return

    async def _dispatch(self, by_tenant: dict[str, list[tuple[JobRecord, int, list[str]]]]) -> None:
        """Round-robin over tenants with eligible jobs; a saturated tenant is skipped."""
        tenants = sorted(by_tenant)
        if not tenants:
            return
        self._rotation = (self._rotation + 1) % len(tenants)
        order = tenants[self._rotation :] + tenants[: self._rotation]
        progress = True
        while progress and self._free() > 0:
            progress = False
            for tenant in order:
                queue = by_tenant[tenant]
                if not queue or self._free() <= 0:
                    continue
                if self._busy(tenant) >= self._settings.worker_concurrency_per_tenant:
                    queue.clear()
                    continue
                record, revision, tenant_keys = queue.pop(0)
                if await self._claim(record, revision, tenant_keys):
                    progress = True

    async def _claim(self, record: JobRecord, revision: int, tenant_keys: list[str]) -> bool:
        if record.cancel_requested:
            await self._finish_cancelled(record.job_id)
            return False
        if record.expired():
            return False
        fleet_token = None
        if self._fleet is not None:
            fleet_token = await self._fleet.acquire(tenant_keys[0], also=tenant_keys[1:])
            if fleet_token is None:
                return False  # saturated fleet: the job stays pending for a later scan
        token = secrets.token_hex(16)
        claimed = record.next(
            state="running",
            lease_owner=self.owner,
            lease_token=token,
            lease_expires=time.time() + self._settings.lease_ms / 1000,
            attempt=record.attempt + 1,
        )
        if not await self._jobs.swap(record, revision, claimed):
            if fleet_token is not None and self._fleet is not None:
                await self._fleet.release(fleet_token)
            return False
        log.info(
            "async job claimed",
            job=record.job_id,
            attempt=claimed.attempt,
            reclaimed=record.state == "running",
        )
        task = asyncio.get_running_loop().create_task(self._traced(claimed, fleet_token))
        self._running[record.job_id] = (tenant_keys[0], task)
        return True

    # Running one job.

    async def _traced(self, record: JobRecord, fleet: str | None) -> None:
        """:meth:`_run` inside the attempt's span, a child of the submission's context.

        Parent-child, not a link, for every attempt, a reclaimed one included:
        the attempt is caused by that one submission (not by the replica that
        died), so its trace shows the submission and each attempt (numbered)
        under it; a dead attempt's span is never exported, so there would be
        nothing to link to anyway. Links suit work that batches many triggers.
        """
        attributes = {
            "db.system.name": "lake",
            "db.operation.name": "execute",
            "lake.async.attempt": record.attempt,
        }
        with resumed_span(JOB_SPAN, record.traceparent, record.tracestate, attributes):
            await self._run(record, fleet)

    def _lease_held(self, token: str) -> Callable[[JobRecord], JobRecord | None]:
        def renew(current: JobRecord) -> JobRecord | None:
            if current.lease_token != token or current.terminal:
                raise _LeaseLost()
            return current.next(lease_expires=time.time() + self._settings.lease_ms / 1000)

        return renew

    async def _renew(self, record: JobRecord, stop: threading.Event, fleet: str | None) -> None:
        assert record.lease_token is not None
        while not stop.is_set():
            await asyncio.sleep(self._settings.lease_ms / 3000)
            try:
                current = await self._jobs.update(
                    record.job_id, self._lease_held(record.lease_token)
                )
            except _LeaseLost:
                log.warning("async job lease lost", job=record.job_id)
                stop.set()
                return
            except LakeError:
                continue  # the next renewal may reach the store; the lease has slack
            if current is None or current.cancel_requested:
                stop.set()
                return
            if fleet is not None and self._fleet is not None:
                await self._fleet.renew(fleet)

    async def _run(self, record: JobRecord, fleet: str | None) -> None:
        stop = self._stops[record.job_id] = _Stop()
        renewer = asyncio.get_running_loop().create_task(self._renew(record, stop, fleet))
        prefix = f"{record.job_id}/{record.attempt}"
        try:
            body = self._seal.open_body(record)
            schema = schema_from_base64(body.schema_ipc)
            async with asyncio.timeout(self._settings.execution_timeout_ms / 1000):
                tries = 0
                while True:
                    # Each try's own stop (write_parts sets it as it ends), set by the job's.
                    this_try = _Stop()
                    stop.on_set(this_try.set)
                    try:
                        parts = await write_parts(
                            schema,
                            self._produce(body.spec, body.principal, this_try),
                            self._results,
                            prefix,
                            self._threads,
                            this_try,
                            part_bytes=self._settings.part_bytes,
                            # The job's own ceiling: a looser restart never enlarges it.
                            max_result_bytes=record.max_result_bytes,
                            tagger=functools.partial(
                                self._seal.tags.tagger, record.job_id, record.attempt
                            ),
                            after_part=lambda: faults.crash(faults.ASYNC_AFTER_PART),
                            midway=self._midway,
                        )
                        break
                    except LakeError as error:
                        if not transient(error) or stop.is_set():
                            raise
                        tries += 1
                        await self._back_off(record, prefix, error, tries, stop)
            await self._publish(record, prefix, parts)
        except TimeoutError:
            stop.set()
            await self._fail(
                record, DeadlineExceeded("the async query passed its execution deadline"), prefix
            )
        except QueryCancelled:
            await self._settle_stopped(record, prefix)
        except LakeError as error:
            await self._fail(record, error, prefix)
        except asyncio.CancelledError:
            raise  # replica shutting down: the lease lapses and another replica takes over
        except Exception as exc:
            log.error("async job failed", job=record.job_id, error_type=type(exc).__name__)
            await self._fail(record, Internal("the async query failed"), prefix)
        finally:
            stop.set()
            renewer.cancel()
            with contextlib.suppress(BaseException):
                await renewer
            if fleet is not None and self._fleet is not None:
                await self._fleet.release(fleet)
            self._running.pop(record.job_id, None)
            self._stops.pop(record.job_id, None)
            self.wake()

    async def _back_off(
        self, record: JobRecord, prefix: str, error: LakeError, tries: int, stop: _Stop
    ) -> None:
        """Before running a job again after a transient ``error``: its parts go, then a wait.

        The wait doubles from :data:`RETRY_BACKOFF_S` (with jitter) up to its cap;
        the job's execution timeout around the retries bounds them all. A job
        stopped meanwhile (cancelled, lease lost) ends as a stopped job.
        """
        await self._results.delete_prefix(prefix)
        first, cap = RETRY_BACKOFF_S
        delay = min(cap, first * 2 ** min(tries - 1, 16)) * (0.5 + secrets.randbelow(1000) / 1000)
        log.info(
            "async job retrying",
            job=record.job_id,
            error_code=error.code,
            tries=tries,
            delay_ms=round(delay * 1000),
        )
        waited = 0.0
        while waited < delay and not stop.is_set():
            step = min(0.05, delay - waited)
            await asyncio.sleep(step)
            waited += step
        if stop.is_set():
            raise QueryCancelled("the async query was stopped")

    def _midway(self) -> None:
        """On the store's thread, a part begun: the armed fault fails the Nth one, once."""
        if self._fail_part is not None and next(self._parts_begun) == self._fail_part:
            log.warning("async result part failed by fault point", part=self._fail_part)
            raise Unavailable("object storage did not accept an async result part")

    def _produce(
        self, spec: QuerySpec, principal: Principal, stop: _Stop
    ) -> Callable[[], Iterator[pa.RecordBatch]]:
        def batches() -> Iterator[pa.RecordBatch]:
            stream = self._execute(spec, principal)
            abort = getattr(stream, "abort", None)
            if abort is not None:
                # Cancel, deadline or a lost lease stop the batch being computed too:
                # the worker slot is free as soon as the engine yields.
                stop.on_set(abort)
            try:
                yield from stream
            finally:
                stream.close()

        return batches

    def _owned(self, token: str | None, **changes: Any) -> Callable[[JobRecord], JobRecord | None]:
        def change(current: JobRecord) -> JobRecord | None:
            if current.lease_token != token or current.terminal:
                raise _LeaseLost()
            return current.next(lease_owner=None, lease_token=None, lease_expires=0.0, **changes)

        return change

    async def _publish(self, record: JobRecord, prefix: str, parts: list[Any]) -> None:
        manifest = ResultManifest(
            job_id=record.job_id,
            attempt=record.attempt,
            rows=sum(p.rows for p in parts),
            bytes=sum(p.bytes for p in parts),
            parts=tuple(parts),
        )
        key = f"{prefix}/manifest.json"
        await self._results.write_once(key, manifest.model_dump_json().encode())
        try:
            await self._jobs.update(
                record.job_id, self._owned(record.lease_token, state="done", manifest=key)
            )
        except _LeaseLost:
            # Another worker owns the job now; this attempt's result is never named.
            await self._results.delete_prefix(prefix)
            return
        await self._jobs.store.remove(ACTIVE, record.job_id)
        log.info("async job done", job=record.job_id, parts=len(parts), rows=manifest.rows)

    async def _fail(self, record: JobRecord, error: LakeError, prefix: str) -> None:
        await self._results.delete_prefix(prefix)
        try:
            await self._jobs.update(
                record.job_id,
                self._owned(
                    record.lease_token,
                    state="failed",
                    error_code=error.code,
                    error_message=str(error)[:1000],
                ),
            )
        except _LeaseLost:
            return
        await self._jobs.store.remove(ACTIVE, record.job_id)
        await self._slots.release(record.tenant_key, record.job_id)
        # The attempt's span (current in this task): the code is a closed set.
        trace.get_current_span().set_status(trace.StatusCode.ERROR, error.code)
        log.info("async job failed", job=record.job_id, error_code=error.code)

    async def _settle_stopped(self, record: JobRecord, prefix: str) -> None:
        """Stopped without a result: cancelled by request, or the lease was lost."""
        await self._results.delete_prefix(prefix)
        current = await self._jobs.get(record.job_id)
        if current is not None and current[0].cancel_requested:
            await self._finish_cancelled(record.job_id)

    async def _finish_cancelled(self, job_id: str) -> None:
        def cancel(current: JobRecord) -> JobRecord | None:
            if current.state == "cancelled":
                return None
            return current.next(
                state="cancelled",
                lease_owner=None,
                lease_token=None,
                lease_expires=0.0,
                manifest=None,
            )

        record = await self._jobs.update(job_id, cancel)
        await self._results.delete_prefix(job_id)
        await self._jobs.store.remove(ACTIVE, job_id)
        if record is not None:
            await self._slots.release(record.tenant_key, job_id)


class _LeaseLost(Exception):
    """This worker no longer holds the job's lease."""
