"""Async jobs across a ticket-key rotation (preload, activate, retire), in process.

A job's tenant key and request digest are keyed by the ring key its body was
sealed under, never by whichever key is active when it is read: these tests
rotate the ring between two services sharing one store and check that polls,
retried submissions, tenant slots and the tenant binding do not move.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lake_core.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
)
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.tickets import TicketKeyRing, TicketSealer
from lake_query.jobs.model import JobRecord, JobSeal
from lake_query.jobs.quotas import ExecutionLease, TenantSlots
from lake_query.jobs.results import LocalResults
from lake_query.jobs.service import AsyncQueries
from lake_query.jobs.settings import AsyncSettings
from lake_query.jobs.store import SLOTS, LocalStateStore, StateStore
from lake_query.planning import QuerySpec
from tools.lake_testing.jobs import ONE_COLUMN, GatedExecute

SCHEMA = ONE_COLUMN
KEYS = {"A": os.urandom(32), "B": os.urandom(32)}
#: The rings of the runbook's steps: before, preloaded, activated, retired.
BEFORE = TicketKeyRing(active_id="A", keys={"A": KEYS["A"]})
PRELOADED = TicketKeyRing(active_id="A", keys=dict(KEYS))
ACTIVATED = TicketKeyRing(active_id="B", keys=dict(KEYS))
RETIRED = TicketKeyRing(active_id="B", keys={"B": KEYS["B"]})

ANN = Principal(principal_id="ann", tenant_id="acme", role="admin")
BOB = Principal(principal_id="bob", tenant_id="acme", role="user")
GUS = Principal(principal_id="gus", tenant_id="globex", role="user")


def _seal(ring: TicketKeyRing) -> JobSeal:
    return JobSeal(TicketSealer(ring, "t/job", 3600), TicketSealer(ring, "t/handle", 3600), ring)


class _Never:
    """An execute() never called: these services' worker pools are not started."""

    def __call__(self, spec: QuerySpec, principal: Principal) -> Any:
        raise AssertionError("no job runs in these tests")


def _service(tmp_path: Path, ring: TicketKeyRing, limit: int = 8) -> AsyncQueries:
    """One replica: its own ring, the store every replica shares."""
    return AsyncQueries(
        AsyncSettings(mode="local", max_outstanding_per_tenant=limit),
        LocalStateStore(tmp_path / "state"),
        LocalResults(tmp_path / "results"),
        seal=_seal(ring),
        tickets=TicketSealer(ring, "t", 3600),
        execute=_Never(),
    )


async def _plan(
    descriptor: pb.FlightDescriptor, principal: Principal
) -> tuple[pa.Schema, QuerySpec]:
    return SCHEMA, QuerySpec(sql=descriptor.cmd.decode())


async def _statement(descriptor: pb.FlightDescriptor, principal: Principal) -> QuerySpec:
    return QuerySpec(sql=descriptor.cmd.decode())


def _sql(text: str) -> pb.FlightDescriptor:
    return pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=text.encode())


async def _submit(
    service: AsyncQueries, principal: Principal, sql: str, job_id: str | None = None
) -> bytes:
    """The handle of a submission."""
    info = await service.submit(_sql(sql), principal, job_id, _plan, _statement)
    return info.flight_descriptor.cmd


def _state(info: pb.PollInfo) -> str:
    return str(json.loads(info.info.app_metadata)["state"])


def _jobs(tmp_path: Path) -> list[JobRecord]:
    folder = tmp_path / "state" / "job"
    return [
        JobRecord.model_validate(json.loads(p.read_text())["doc"])
        for p in sorted(folder.glob("*.json"))
    ]


def test_a_job_id_reused_for_another_statement_is_refused(tmp_path: Path) -> None:
    """A retry is the same statement: the id of one job never answers for another."""

    async def go() -> None:
        job_id = "fedcba9876543210fedcba9876543210"
        before = _service(tmp_path, BEFORE)
        await _submit(before, ANN, "SELECT 1", job_id)
        stored = _jobs(tmp_path)
        for ring in (BEFORE, PRELOADED, ACTIVATED):
            replica = _service(tmp_path, ring)
            for other in ("SELECT 2", "SELECT 1 ", "select 1"):
                with pytest.raises(InvalidArgument, match="different statement"):
                    await replica.submit(_sql(other), ANN, job_id, _plan, _statement)
            again = await replica.submit(_sql("SELECT 1"), ANN, job_id, _plan, _statement)
            assert _state(again) == "pending"
        assert _jobs(tmp_path) == stored  # nothing new was written or run

    asyncio.run(go())


def test_a_job_submitted_before_activation_polls_and_retries_after_it(tmp_path: Path) -> None:
    async def go() -> None:
        job_id = "0123456789abcdef0123456789abcdef"
        before = _service(tmp_path, BEFORE)
        handle = await _submit(before, ANN, "SELECT 1", job_id)
        foreign = await _submit(before, GUS, "SELECT 2")
        [stored] = [j for j in _jobs(tmp_path) if j.job_id == job_id]
        # Mid-rollout: one replica activated B, one still seals with A. Both agree.
        for ring in (PRELOADED, ACTIVATED):
            replica = _service(tmp_path, ring)
            assert _state(await replica.poll(handle, ANN)) == "pending"
            # The submitter's retry finds the one job (its request digest still matches).
            again = await replica.submit(_sql("SELECT 1"), ANN, job_id, _plan, _statement)
            assert _state(again) == "pending"
            # The tenant binding holds across the rotation.
            with pytest.raises(PermissionDenied):
                await replica.submit(_sql("SELECT 1"), GUS, job_id, _plan, _statement)
            with pytest.raises(PermissionDenied):
                await replica.submit(_sql("SELECT 1"), BOB, job_id, _plan, _statement)
            with pytest.raises(PermissionDenied):
                await replica.poll(foreign, ANN)
            # A refreshed handle (sealed under the active key) names the same job.
            refreshed = again.flight_descriptor.cmd
            assert _state(await replica.poll(refreshed, ANN)) == "pending"
        # Still one record for the id, unchanged: the retries ran nothing new.
        [after] = [j for j in _jobs(tmp_path) if j.job_id == job_id]
        assert after == stored
        assert len(_jobs(tmp_path)) == 2

    asyncio.run(go())


def test_a_tenants_outstanding_jobs_are_counted_under_every_key_of_the_ring(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        before = _service(tmp_path, BEFORE, limit=3)
        old = [await _submit(before, ANN, f"SELECT {n}") for n in range(3)]
        with pytest.raises(ResourceExhausted):
            await _submit(before, ANN, "SELECT 9")
        preloaded = _service(tmp_path, PRELOADED, limit=3)
        activated = _service(tmp_path, ACTIVATED, limit=3)
        # The 4th is refused on a replica that activated B and on one that did not.
        for replica in (activated, preloaded):
            with pytest.raises(ResourceExhausted):
                await _submit(replica, BOB, "SELECT 9")
        # Another tenant is unaffected.
        await _submit(activated, GUS, "SELECT 9")
        # Cancelling an A-era job frees its slot for a B-era one, and no more.
        info = pb.FlightInfo(flight_descriptor=pb.FlightDescriptor(cmd=old[0]))
        assert await activated.cancel(info, ANN) == pb.CANCEL_STATUS_CANCELLED
        await _submit(activated, ANN, "SELECT 10")
        for replica in (activated, preloaded):
            with pytest.raises(ResourceExhausted):
                await _submit(replica, ANN, "SELECT 11")
        # Slots live in one document per (tenant, key): A's two and B's one.
        store = LocalStateStore(tmp_path / "state")
        seal = _seal(ACTIVATED)
        counts = []
        for key_id in ("A", "B"):
            found = await store.read(SLOTS, seal.tenant_key(ANN, key_id))
            counts.append(0 if found is None else len(found[0]["jobs"]))
        assert counts == [2, 1]

    asyncio.run(go())


class _Interleaved(LocalStateStore):
    """A store where another replica reserves in the A document right after a write to B."""

    def __init__(self, root: Path, b_key: str, concurrent: Any) -> None:
        super().__init__(root)
        self._b_key = b_key
        self._concurrent = concurrent

    async def write(self, family: str, key: str, doc: dict[str, Any], expect: int | None) -> bool:
        written = await super().write(family, key, doc, expect)
        if written and family == SLOTS and key == self._b_key and self._concurrent is not None:
            concurrent, self._concurrent = self._concurrent, None
            await concurrent()
        return written


def test_a_slot_raced_by_a_reservation_under_another_key_is_given_back(tmp_path: Path) -> None:
    """Writers of two documents are not fenced by one CAS: the read after the write is."""

    async def go() -> None:
        a_key, b_key = "ta", "tb"
        plain: StateStore = LocalStateStore(tmp_path)
        a_replica = TenantSlots(plain, 2)
        await a_replica.reserve(a_key, "1" * 32, also=[b_key])

        async def concurrent() -> None:
            # A replica with A active, which read B's document before our write.
            found = await plain.read(SLOTS, a_key)
            assert found is not None
            jobs = {**found[0]["jobs"], "2" * 32: time.time()}
            assert await plain.write(SLOTS, a_key, {"jobs": jobs}, found[1])

        b_replica = TenantSlots(_Interleaved(tmp_path, b_key, concurrent), 2)
        with pytest.raises(ResourceExhausted):
            await b_replica.reserve(b_key, "3" * 32, also=[a_key])
        # Given back: two outstanding, never three.
        b_doc = await plain.read(SLOTS, b_key)
        assert b_doc is not None
        assert b_doc[0]["jobs"] == {}
        assert await a_replica.count(a_key) == 2

    asyncio.run(go())


def test_a_job_whose_key_left_the_ring_fails_typed(tmp_path: Path) -> None:
    async def go() -> None:
        job_id = "fedcba9876543210fedcba9876543210"
        before = _service(tmp_path, BEFORE)
        handle = await _submit(before, ANN, "SELECT 1", job_id)
        activated = _service(tmp_path, ACTIVATED)
        refreshed = (await activated.poll(handle, ANN)).flight_descriptor.cmd
        retired = _service(tmp_path, RETIRED)
        for held in (handle, refreshed):  # sealed under A, and re-sealed under B
            with pytest.raises(FailedPrecondition, match="submit the query again"):
                await retired.poll(held, ANN)
        with pytest.raises(FailedPrecondition, match="submit the query again"):
            await retired.submit(_sql("SELECT 1"), ANN, job_id, _plan, _statement)
        # A worker holding only B fails the job with the same typed error, and frees its slot.
        retired.start()
        try:
            for _ in range(200):
                [record] = _jobs(tmp_path)
                if record.terminal:
                    break
                await asyncio.sleep(0.05)
        finally:
            await retired.close()
        assert (record.state, record.error_code) == ("failed", "FailedPrecondition")
        assert "submit the query again" in (record.error_message or "")
        slots = await LocalStateStore(tmp_path / "state").read(SLOTS, record.tenant_key)
        assert slots is not None
        assert slots[0]["jobs"] == {}

    asyncio.run(go())


def test_a_tenants_jobs_under_two_keys_share_its_per_tenant_worker_limit(tmp_path: Path) -> None:
    async def go() -> None:
        # One job submitted before the activation, one after: the same tenant.
        for ring, sql in ((BEFORE, "SELECT 1"), (ACTIVATED, "SELECT 2")):
            await _submit(_service(tmp_path, ring), ANN, sql)
        execute = GatedExecute()
        worker = AsyncQueries(
            AsyncSettings(mode="local", worker_concurrency=2, worker_concurrency_per_tenant=1),
            LocalStateStore(tmp_path / "state"),
            LocalResults(tmp_path / "results"),
            seal=_seal(ACTIVATED),
            tickets=TicketSealer(ACTIVATED, "t", 3600),
            execute=execute,
        )
        worker.start()
        try:
            for _ in range(200):
                if execute.sqls:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            assert len(execute.sqls) == 1, "one tenant ran two jobs at once"
            execute.gate.set()
            for _ in range(200):
                if all(j.state == "done" for j in _jobs(tmp_path)):
                    break
                await asyncio.sleep(0.05)
            assert sorted(execute.sqls) == ["SELECT 1", "SELECT 2"]
        finally:
            execute.gate.set()
            await worker.close()

    asyncio.run(go())


def test_the_fleet_lease_knows_a_tenant_under_either_key(tmp_path: Path) -> None:
    async def go() -> None:
        lease = ExecutionLease(LocalStateStore(tmp_path), total=4, per_tenant=1, ttl_s=30)
        # A replica with A active holds the tenant's one token; one with B active asks.
        held = await lease.acquire("ta", also=["tb"])
        assert held is not None
        assert await lease.acquire("tb", also=["ta"]) is None
        await lease.release(held)
        # A holder written by an older replica (no "also") is matched on its key too.
        held = await lease.acquire("ta")
        assert held is not None
        assert await lease.acquire("tb", also=["ta"]) is None
        assert await lease.acquire("tc", also=["td"]) is not None

    asyncio.run(go())
