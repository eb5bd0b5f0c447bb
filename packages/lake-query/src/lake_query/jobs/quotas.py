"""Durable limits shared by every replica: tenant slots and the fleet execution lease.

Slots: one document per tenant key listing its outstanding job ids, each
with the time it was reserved. A tenant has one tenant key per key of the
ticket key ring (:class:`~lake_query.jobs.model.JobSeal`); a job's slot is in
the document of the key it was sealed under, and a reservation counts the
tenant's jobs in every document its ring can name. Submission reserves a
slot *before* the job is written; a full list is reconciled by point reads
of its jobs, dropping only jobs that are gone (and were reserved long enough
ago that their submission cannot still be writing them), expired, cancelled
or failed, so a crash can keep a slot too long but never lose a live one.

The execution lease (only with ``LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY``): one
document of opaque holder tokens with expiries and tenant keys; a worker
takes a token before it claims a job and renews it with the job's lease.
Errors name no tenant, job or size.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from lake_core.errors import ResourceExhausted
from lake_query.jobs.model import JobRecord
from lake_query.jobs.store import JOBS, LEASES, SLOTS, Document, StateStore

__all__ = ["ExecutionLease", "TenantSlots"]

#: A reservation whose job is not written yet is kept at least this long.
RESERVATION_GRACE_S = 120.0
_ATTEMPTS = 32


class TenantSlots:
    def __init__(self, store: StateStore, limit: int) -> None:
        self._store = store
        self.limit = limit

    async def _live(self, job_id: str, reserved_at: float, now: float) -> bool:
        found = await self._store.read(JOBS, job_id)
        if found is None:
            return now - reserved_at < RESERVATION_GRACE_S
        record = JobRecord.model_validate(found[0])
        return record.state in ("pending", "running", "done") and not record.expired(now)

    async def _jobs_of(self, tenant_key: str, now: float, reconcile: bool) -> Document | None:
        """One slot document; ``reconcile``: dead entries dropped (persisted when the CAS holds)."""
        found = await self._store.read(SLOTS, tenant_key)
        if found is None or not reconcile:
            return found
        jobs = {j: t for j, t in found[0]["jobs"].items() if await self._live(j, t, now)}
        changed = len(jobs) < len(found[0]["jobs"])
        if changed and not await self._store.write(SLOTS, tenant_key, {"jobs": jobs}, found[1]):
            return found  # moved meanwhile: count it as it was (never fewer)
        return {"jobs": jobs}, found[1]

    async def _outstanding(
        self, tenant_keys: Sequence[str], now: float, reconcile: bool
    ) -> set[str]:
        jobs: set[str] = set()
        for tenant_key in tenant_keys:
            found = await self._jobs_of(tenant_key, now, reconcile)
            if found is not None:
                jobs.update(found[0]["jobs"])
        return jobs

    async def reserve(self, tenant_key: str, job_id: str, *, also: Sequence[str] = ()) -> None:
        """Hold a slot for ``job_id`` or raise ResourceExhausted (retry later).

        ``also``: the tenant's keys under the ring's other keys. During a key
        rotation a tenant's outstanding jobs sit in two documents (the old key's
        and the new key's), so every one is counted, a job in both once. A
        conditional write fences writers of one document only, so with several
        the slot is written first and then every document read again: of two
        submissions racing in different documents, the later reader sees both
        and gives its slot back, so the limit holds (at worst both give back).
        """
        for _ in range(_ATTEMPTS):
            now = time.time()
            found = await self._store.read(SLOTS, tenant_key)
            jobs: dict[str, float] = dict(found[0]["jobs"]) if found else {}
            elsewhere = await self._outstanding(also, now, reconcile=False)
            if job_id in jobs or job_id in elsewhere:
                return
            if len(jobs.keys() | elsewhere) >= self.limit:
                jobs = {j: t for j, t in jobs.items() if await self._live(j, t, now)}
                elsewhere = await self._outstanding(also, now, reconcile=True)
            if len(jobs.keys() | elsewhere) >= self.limit:
                raise ResourceExhausted(
                    "too many outstanding async queries: wait for one to finish or cancel one"
                )
            jobs[job_id] = now
            if not await self._store.write(
                SLOTS, tenant_key, {"jobs": jobs}, None if found is None else found[1]
            ):
                continue
            if also and len(await self._outstanding([tenant_key, *also], now, False)) > self.limit:
                await self.release(tenant_key, job_id)
                raise ResourceExhausted(
                    "too many outstanding async queries: wait for one to finish or cancel one"
                )
            return
        raise ResourceExhausted("async query slots are contended; retry")

    async def release(self, tenant_key: str, job_id: str) -> None:
        for _ in range(_ATTEMPTS):
            found = await self._store.read(SLOTS, tenant_key)
            if found is None or job_id not in found[0]["jobs"]:
                return
            jobs = {j: t for j, t in found[0]["jobs"].items() if j != job_id}
            if await self._store.write(SLOTS, tenant_key, {"jobs": jobs}, found[1]):
                return

    async def count(self, tenant_key: str) -> int:
        found = await self._store.read(SLOTS, tenant_key)
        return 0 if found is None else len(found[0]["jobs"])


class ExecutionLease:
    """At most ``total`` jobs fleet-wide, ``per_tenant`` of one tenant."""

    KEY = "execution"

    def __init__(self, store: StateStore, total: int, per_tenant: int, ttl_s: float) -> None:
        self._store = store
        self.total = total
        self.per_tenant = per_tenant
        self.ttl_s = ttl_s

    async def acquire(self, tenant_key: str, *, also: Sequence[str] = ()) -> str | None:
        """An opaque holder token, or None when the fleet or the tenant is saturated.

        ``also``: the tenant's keys under the ring's other keys. A holder is the
        same tenant's when any of its keys is one of ours, so replicas a
        rotation step apart (their rings share a key) still agree. Holders
        written without ``also`` (older replicas) are matched on ``tenant``.
        """
        mine = {tenant_key, *also}
        for _ in range(_ATTEMPTS):
            found = await self._store.read(LEASES, self.KEY)
            now = time.time()
            holders = {
                token: held
                for token, held in (found[0]["holders"] if found else {}).items()
                if held["expires"] > now
            }
            same = sum(
                1
                for held in holders.values()
                if not mine.isdisjoint([held["tenant"], *held.get("also", ())])
            )
            if len(holders) >= self.total or same >= self.per_tenant:
                return None
            token = secrets.token_hex(16)
            holders[token] = {"tenant": tenant_key, "expires": now + self.ttl_s}
            if also:
                holders[token]["also"] = list(also)
            if await self._store.write(
                LEASES, self.KEY, {"holders": holders}, None if found is None else found[1]
            ):
                return token
        return None

    async def renew(self, token: str) -> bool:
        for _ in range(_ATTEMPTS):
            found = await self._store.read(LEASES, self.KEY)
            if found is None or token not in found[0]["holders"]:
                return False
            holders = dict(found[0]["holders"])
            holders[token] = {**holders[token], "expires": time.time() + self.ttl_s}
            if await self._store.write(LEASES, self.KEY, {"holders": holders}, found[1]):
                return True
        return False

    async def release(self, token: str) -> None:
        for _ in range(_ATTEMPTS):
            found = await self._store.read(LEASES, self.KEY)
            if found is None or token not in found[0]["holders"]:
                return
            holders = {t: h for t, h in found[0]["holders"].items() if t != token}
            if await self._store.write(LEASES, self.KEY, {"holders": holders}, found[1]):
                return
