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

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.lake_testing.fleet import (
    SCHEMA,
    TABLE,
    Endpoint,
    FleetShape,
    LocalFleet,
    LostCheck,
    Record,
    Workload,
    assert_workload_held,
    nothing_lost,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

WORKLOAD_S = 25.0


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[LocalFleet]:
    lake = LocalFleet.start(tmp_path)
    try:
        yield lake
    finally:
        lake.stop()


def check(record: Record, lost: LostCheck) -> None:
    """Issue 30's asserts, after printing everything that went wrong."""
    print(record.report())
    print("nothing-lost:", lost.rows, "rows,", lost.files_checked, "FILE values;", lost.problems())
    assert_workload_held(record, lost)


def test_fleet_workload_reads_never_fail_and_nothing_is_lost(
    fleet: LocalFleet, tmp_path: Path
) -> None:
    a, b = fleet.replicas_started(2)
    create_version = fleet.admin(lambda c: c.create_table(TABLE, SCHEMA)).entry.descriptor.version
    workload = Workload(a, b, FleetShape())
    started = time.monotonic()
    workload.start()
    # The nothing-lost check's fresh process: a replica that serves none of the workload,
    # started beside it (a start takes many seconds on a loaded machine).
    fresh: list[Endpoint] = []
    starting = threading.Thread(target=lambda: fresh.extend(fleet.replicas_started(1)))
    starting.start()
    try:
        assert workload.wait_for_appends(10, timeout_s=60), workload.record.report()
        workload.record.gc = fleet.gc_during(workload, tmp_path / "gc-plans")
        while time.monotonic() - started < WORKLOAD_S:
            time.sleep(0.2)
    finally:
        workload.finish()
    print(f"workload ran {time.monotonic() - started:.1f}s")
    final = fleet.admin(lambda c: c.describe_table(TABLE)).entry.descriptor.version
    starting.join(timeout=120)
    assert fresh, "the fresh replica did not start"
    checked = time.monotonic()
    lost = nothing_lost(
        workload.record,
        fresh[0],
        final,
        create_version=create_version,
        leftovers=fleet.leftovers,
    )
    print(f"nothing-lost check took {time.monotonic() - checked:.1f}s")
    check(workload.record, lost)
