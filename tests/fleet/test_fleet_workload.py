"""The fleet workload on real processes: one Metasrv, replica A (appends and reads), replica B (reads).

All at once, for ``WORKLOAD_S`` seconds: SDK writers appending 1,000-row
batches through A (one with FILE values uploaded through the SDK), each then
reading its own rows through B; ADBC readers on A and B; ticket-then-read
clients; durable async jobs; a never-read DoGet from a default gRPC client;
``lake gc`` plan and apply. Default retention and GC safety rules throughout
(async queries on, as they must be for jobs). Asserts issue 30's contract:
no read fails, nothing lost or duplicated, read-your-writes, GC reclaims.
Every failure is printed with its class before the asserts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lake_core.metaclient import MetaClient
from lake_core.models import DataLocation
from tests.gc.conftest import HOUR_S, age, run_gc
from tools.lake_testing.fleet import (
    SCHEMA,
    TABLE,
    Endpoint,
    FleetShape,
    GcRun,
    LostCheck,
    Record,
    Workload,
    nothing_lost,
    run_gc_during,
    upload_garbage,
    violations,
)
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WORKLOAD_S = 30.0


@dataclass
class LocalFleet:
    root: Path
    meta: LakeProcess
    env: dict[str, str]
    replicas: list[LakeProcess]

    @property
    def data(self) -> Path:
        return self.root / "data"

    def replica(self) -> LakeProcess:
        process = start_query(
            self.meta.addr,
            self.root,
            env=self.env,
            extra_args=("--data-dir", str(self.data)),  # async jobs live beside the catalog
        )
        self.replicas.append(process)
        return process

    def admin(self, work: Any) -> Any:
        async def go() -> Any:
            async with MetaClient(f"http://{self.meta.addr}", timeout_s=120) as client:
                return await work(client)

        return asyncio.run(go())

    def stop(self) -> None:
        for process in self.replicas:
            process.stop()
        self.meta.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(tmp_path / "ticket-keys.json")),
        "LAKE_MANAGED_OBJECT_ROOT": str(tmp_path / "data" / "objects"),
        "LAKE_ASYNC_QUERIES": "true",
    }
    meta = start_meta(tmp_path / "data", tmp_path, env=env)
    lake = LocalFleet(tmp_path, meta, env, [])
    try:
        yield lake
    finally:
        lake.stop()


def endpoint(name: str, process: LakeProcess) -> Endpoint:
    return Endpoint(name, process.addr)


def local_path(location: DataLocation) -> Path:
    return Path(location.uri.removeprefix("file://"))


def garbage(record: Record, a: Endpoint) -> list[DataLocation]:
    """Garbage older than the (default-sized) safety age: local ages are modification times."""
    made = upload_garbage(record, a)
    for location in made:
        age(local_path(location), 2 * HOUR_S)
    return made


def check(record: Record, lost: LostCheck) -> None:
    """Issue 30's asserts, after printing everything that went wrong."""
    print(record.report())
    print("nothing-lost:", lost.rows, "rows,", lost.files_checked, "FILE values;", lost.problems())
    broken = violations(record, lost)
    print("broken:", *broken, sep="\n  ")
    assert broken == []


def test_fleet_workload_reads_never_fail_and_nothing_is_lost(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    a, b = endpoint("A", fleet.replica()), endpoint("B", fleet.replica())
    create_version = fleet.admin(lambda c: c.create_table(TABLE, SCHEMA)).entry.descriptor.version
    workload = Workload(a, b, FleetShape())
    started = time.monotonic()
    workload.start()
    gc: GcRun | None = None
    try:
        assert workload.wait_for_appends(10, timeout_s=60), workload.record.report()
        plans = tmp_path / "gc-plans"

        def plan(attempt: int) -> tuple[int, dict[str, Any]]:
            directory = plans / f"p{attempt}"
            return run_gc(fleet.data, "--plan", str(directory), "--safety-age-secs", str(HOUR_S))

        def apply(attempt: int) -> tuple[int, dict[str, Any]]:
            directory = plans / f"p{attempt}"
            checkpoint = plans / f"p{attempt}.apply.json"
            return run_gc(
                fleet.data, "--plan", str(directory), "--apply", "--checkpoint", str(checkpoint)
            )

        gc = run_gc_during(
            workload,
            lambda: garbage(workload.record, a),
            plan,
            apply,
            lambda location: local_path(location).exists(),
        )
        workload.record.gc = gc
        while time.monotonic() - started < WORKLOAD_S:
            time.sleep(0.2)
    finally:
        workload.finish()
    print(f"workload ran {time.monotonic() - started:.1f}s")
    final = fleet.admin(lambda c: c.describe_table(TABLE)).entry.descriptor.version
    fresh = endpoint("fresh", fleet.replica())
    checked = time.monotonic()
    lost = nothing_lost(workload.record, fresh, final, create_version=create_version)
    print(f"nothing-lost check took {time.monotonic() - checked:.1f}s")
    check(workload.record, lost)
