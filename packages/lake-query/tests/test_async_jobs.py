"""Async job configuration, tenant slots, the fleet lease and fair scheduling, in process."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from lake_core.errors import ConfigError, DataCorrupted, FailedPrecondition, ResourceExhausted
from lake_core.principal import Principal
from lake_core.schemas import schema_to_base64
from lake_core.tickets import TicketKeyRing, TicketSealer
from lake_query.jobs.model import JobBody, JobSeal
from lake_query.jobs.quotas import ExecutionLease, TenantSlots
from lake_query.jobs.results import LocalResults
from lake_query.jobs.service import AsyncQueries
from lake_query.jobs.settings import AsyncSettings
from lake_query.jobs.store import ACTIVE, JOBS, LocalStateStore
from lake_query.jobs.workers import Jobs, WorkerPool
from lake_query.planning import QuerySpec
from tools.lake_testing.jobs import ONE_COLUMN, GatedExecute, job_record

ON = {"LAKE_ASYNC_QUERIES": "true"}


def test_settings_are_validated_before_anything_binds(tmp_path: Path) -> None:
    assert AsyncSettings.from_env({}, data_dir=tmp_path) is None
    local = AsyncSettings.from_env(ON, data_dir=tmp_path)
    assert local is not None
    assert local.state_dir == tmp_path / "async-query-state"
    assert local.results_dir == tmp_path / "async-query-results"
    assert (local.worker_concurrency, local.worker_concurrency_per_tenant) == (4, 1)
    assert local.execution_timeout_ms == 30 * 60 * 1000
    assert local.max_outstanding_per_tenant == 8
    assert local.max_result_bytes == 16 * 1024**3
    s3 = AsyncSettings.from_env({**ON, "LAKE_S3_BUCKET": "lake-bucket"}, data_dir=None)
    assert s3 is not None
    assert (s3.mode, s3.dynamodb_table, s3.result_prefix) == (
        "s3",
        "lake_async_queries",
        "async-query-results",
    )
    bad: list[dict[str, str]] = [
        {"LAKE_ASYNC_QUERIES": "maybe"},
        {
            **ON,
            "LAKE_ASYNC_WORKER_CONCURRENCY": "2",
            "LAKE_ASYNC_WORKER_CONCURRENCY_PER_TENANT": "3",
        },
        {**ON, "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY": "4"},
        {
            **ON,
            "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY": "2",
            "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT": "3",
        },
        {
            **ON,
            "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY": "65",
            "LAKE_ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT": "1",
        },
        {**ON, "LAKE_ASYNC_MAX_OUTSTANDING_PER_TENANT": "129"},
        {**ON, "LAKE_ASYNC_MAX_RESULT_BYTES": str(64 * 1024**2 - 1)},
        {**ON, "LAKE_ASYNC_MAX_RESULT_BYTES": str(256 * 1024**3 + 1)},
        {**ON, "LAKE_S3_BUCKET": "lake-bucket", "LAKE_ASYNC_DYNAMODB_TABLE": "lake_registry"},
        {**ON, "LAKE_S3_BUCKET": "lake-bucket", "LAKE_ASYNC_RESULT_PREFIX": "a/../b"},
    ]
    for env in bad:
        with pytest.raises(ConfigError):
            AsyncSettings.from_env(env, data_dir=tmp_path)
    with pytest.raises(ConfigError, match="--data-dir"):
        AsyncSettings.from_env(ON, data_dir=None)


def _seal(ring: TicketKeyRing) -> JobSeal:
    return JobSeal(TicketSealer(ring, "t/job", 3600), TicketSealer(ring, "t/handle", 3600), ring)


def test_slots_refuse_past_the_limit_and_reconcile_finished_jobs(tmp_path: Path) -> None:
    async def go() -> None:
        store = LocalStateStore(tmp_path)
        slots = TenantSlots(store, 2)
        for job_id in ("a" * 32, "b" * 32):
            await store.write(JOBS, job_id, job_record(job_id, "t1").model_dump(mode="json"), None)
            await slots.reserve("t1", job_id)
        await slots.reserve("t1", "a" * 32)  # a retry of the same job holds no second slot
        with pytest.raises(ResourceExhausted) as refused:
            await slots.reserve("t1", "c" * 32)
        assert "t1" not in str(refused.value)
        await slots.reserve("t2", "c" * 32)  # other tenants are unaffected
        # A failed job's slot is reclaimed by reconciliation; a running one's never is.
        failed = job_record("b" * 32, "t1", "failed")
        found = await store.read(JOBS, "b" * 32)
        assert found is not None
        await store.write(JOBS, "b" * 32, failed.model_dump(mode="json"), found[1])
        await slots.reserve("t1", "d" * 32)
        assert await slots.count("t1") == 2
        with pytest.raises(ResourceExhausted):
            await slots.reserve("t1", "e" * 32)  # "d" is not written yet: still counted

    asyncio.run(go())


def test_the_fleet_lease_bounds_total_and_per_tenant(tmp_path: Path) -> None:
    async def go() -> None:
        lease = ExecutionLease(LocalStateStore(tmp_path), total=2, per_tenant=1, ttl_s=30)
        first = await lease.acquire("t1")
        assert first is not None
        assert await lease.acquire("t1") is None  # tenant at its share
        second = await lease.acquire("t2")
        assert second is not None
        assert await lease.acquire("t3") is None  # fleet at its total
        await lease.release(first)
        assert await lease.acquire("t3") is not None
        assert await lease.renew(second)
        assert not await lease.renew("not-a-token")

    asyncio.run(go())


SCHEMA = ONE_COLUMN


def test_workers_go_round_robin_across_tenants_without_parking_slots(tmp_path: Path) -> None:
    async def go() -> None:
        ring = TicketKeyRing.ephemeral()
        seal = _seal(ring)
        store = LocalStateStore(tmp_path / "state")
        settings = AsyncSettings(
            mode="local", worker_concurrency=2, worker_concurrency_per_tenant=1, lease_ms=5000
        )
        execute = GatedExecute()
        pool = WorkerPool(
            settings,
            Jobs(store),
            LocalResults(tmp_path / "results"),
            seal,
            TenantSlots(store, 8),
            execute,
        )
        # Tenant "busy" has three jobs queued first; "quiet" one job, queued last.
        for n, tenant in enumerate(["busy", "busy", "busy", "quiet"]):
            principal = Principal(principal_id="p", tenant_id=tenant, role="admin")
            body = JobBody(
                principal=principal,
                spec=QuerySpec(sql="SELECT 1"),
                schema_ipc=schema_to_base64(SCHEMA),
                max_result_bytes=1 << 20,
            )
            job_id = f"{n:032x}"
            record = job_record(job_id, seal.tenant_key(principal)).model_copy(
                update={"sealed": seal.seal_body(body)}
            )
            await store.write(ACTIVE, job_id, {}, None)
            await store.write(JOBS, job_id, record.model_dump(mode="json"), None)
        pool.start()
        try:
            for _ in range(200):
                if len(execute.tenants) >= 2:
                    break
                await asyncio.sleep(0.05)
            # Both slots busy: one per tenant, none held back for "busy"'s queue.
            assert sorted(execute.tenants) == ["busy", "quiet"]
            await asyncio.sleep(0.5)
            assert len(execute.tenants) == 2  # "busy" is at its per-tenant limit
            execute.gate.set()
            for _ in range(400):
                if len(execute.tenants) == 4:
                    break
                await asyncio.sleep(0.05)
            assert execute.tenants.count("busy") == 3
        finally:
            execute.gate.set()
            await pool.close()

    asyncio.run(go())


def test_jobs_past_their_retention_are_swept_with_their_results_and_slots(tmp_path: Path) -> None:
    async def go() -> None:
        ring = TicketKeyRing.ephemeral()
        seal = _seal(ring)
        store = LocalStateStore(tmp_path / "state")
        results = LocalResults(tmp_path / "results")
        slots = TenantSlots(store, 8)
        pool = WorkerPool(
            AsyncSettings(mode="local"), Jobs(store), results, seal, slots, GatedExecute()
        )
        old, fresh = "a" * 32, "b" * 32
        for job_id, age in ((old, 7200.0), (fresh, 0.0)):
            record = job_record(job_id, "t1", "done").model_copy(
                update={"expires_at": time.time() + 3600 - age}
            )
            await store.write(JOBS, job_id, record.model_dump(mode="json"), None)
            await slots.reserve("t1", job_id)
            (tmp_path / "results" / job_id / "1").mkdir(parents=True)
            (tmp_path / "results" / job_id / "1" / "part-00000.arrows").write_bytes(b"x")
        assert await pool.sweep() == 1
        assert await store.read(JOBS, old) is None
        assert await store.read(JOBS, fresh) is not None
        assert not (tmp_path / "results" / old).exists()
        assert (tmp_path / "results" / fresh).exists()
        assert await slots.count("t1") == 1

    asyncio.run(go())


def test_a_result_stored_by_an_older_version_or_damaged_polls_as_such(tmp_path: Path) -> None:
    """A schema-1 manifest (plain SHA-256 parts) is refused as such, not as a server fault."""

    async def go() -> None:
        ring = TicketKeyRing.ephemeral()
        seal = _seal(ring)
        state = LocalStateStore(tmp_path / "state")
        results = LocalResults(tmp_path / "results")
        queries = AsyncQueries(
            AsyncSettings(mode="local"),
            state,
            results,
            seal=seal,
            tickets=TicketSealer(ring, "t", 3600),
            execute=GatedExecute(),
        )
        principal = Principal(principal_id="p", tenant_id="t1", role="admin")
        body = JobBody(
            principal=principal,
            spec=QuerySpec(sql="SELECT 1"),
            schema_ipc=schema_to_base64(SCHEMA),
            max_result_bytes=1 << 20,
        )
        job_id = "c" * 32
        old = {
            "schema_version": 1,
            "job_id": job_id,
            "attempt": 1,
            "rows": 1,
            "bytes": 8,
            "parts": [{"name": "part-00000.arrows", "bytes": 8, "rows": 1, "sha256": "0" * 64}],
        }
        await results.write_once(f"{job_id}/1/manifest.json", json.dumps(old).encode())
        record = job_record(job_id, seal.tenant_key(principal), "done").model_copy(
            update={"sealed": seal.seal_body(body), "manifest": f"{job_id}/1/manifest.json"}
        )
        await state.write(JOBS, job_id, record.model_dump(mode="json"), None)
        handle = seal.seal_handle(principal, job_id)
        try:
            with pytest.raises(FailedPrecondition, match="submit the query again"):
                await queries.poll(handle, principal)
            # A damaged manifest is storage's fault, not another version's.
            path = tmp_path / "results" / job_id / "1" / "manifest.json"
            for damaged in (b'{"schema_version": 2, "job_id": ', b"[]", b'{"schema_version": 2}'):
                path.write_bytes(damaged)
                with pytest.raises(DataCorrupted, match="manifest is damaged"):
                    await queries.poll(handle, principal)
        finally:
            await queries.close()

    asyncio.run(go())
