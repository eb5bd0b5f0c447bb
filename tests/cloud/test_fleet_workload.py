"""The fleet workload in cloud mode: SeaweedFS (tables, stage, async results) + dynalite.

The same actors as ``tests/fleet/test_fleet_workload.py`` (writers through
replica A, readers on A and B, tickets, async jobs, a stalled reader,
``lake gc``), on two Metasrv nodes behind the balancer; once as is, and once
with the leader SIGKILLed in the middle while every actor keeps going. Appends
interrupted by the takeover are retried with their operation id (not a
failure); a read may fail with nothing, not even UNAVAILABLE (the SDK retries
that itself; ADBC and pyarrow readers only ever talk to Query, which keeps
serving through the takeover).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lake_core.models import DataLocation
from tests.cloud.conftest import CloudLake
from tools.lake_testing.fleet import (
    SCHEMA,
    TABLE,
    Endpoint,
    FleetShape,
    Workload,
    assert_workload_held,
    nothing_lost,
    run_gc_during,
    upload_garbage,
)
from tools.lake_testing.fleet import lake_gc as run_gc
from tools.lake_testing.servers import LakeProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.s3,
    pytest.mark.dynamodb,
    pytest.mark.timeout(480),
]

WORKLOAD_S = 40.0
#: S3 ages objects by its own clock: garbage must be older than this when GC plans,
#: and every writer's upload is appended well within it (a takeover included).
SAFETY_AGE_S = 30
QUERY_ENV = {
    "LAKE_ASYNC_QUERIES": "true",  # jobs in dynalite, results in the bucket
    "LAKE_QUERY_CATALOG_REFRESH_MS": "1000",  # the default, not the cloud fixture's 200
}


def endpoint(lake: CloudLake, name: str, process: LakeProcess) -> Endpoint:
    return Endpoint(name, process.addr, lake.tokens["fleet"])


def key_of(lake: CloudLake, location: DataLocation) -> str:
    return location.uri.removeprefix(f"s3://{lake.bucket}/")


def exists(lake: CloudLake, location: DataLocation) -> bool:
    listed = lake.s3.client().list_objects_v2(Bucket=lake.bucket, Prefix=key_of(lake, location))
    return any(o["Key"] == key_of(lake, location) for o in listed.get("Contents", []))


def open_uploads(lake: CloudLake) -> list[str]:
    listed = lake.s3.client().list_multipart_uploads(Bucket=lake.bucket)
    return [str(u["Key"]) for u in listed.get("Uploads", [])]


def gc_env(lake: CloudLake) -> dict[str, str]:
    return {k: v for k, v in lake.meta_env.items() if not k.startswith("LAKE_TLS")}


def run_fleet(lake: CloudLake, tmp_path: Path, *, kill_leader: LakeProcess | None) -> None:
    started_a, started_b = lake.start_queries(2)
    a, b = endpoint(lake, "A", started_a), endpoint(lake, "B", started_b)
    created = lake.admin(lambda c: c.create_table(TABLE, SCHEMA)).entry.descriptor.version
    workload = Workload(a, b, FleetShape())
    started = time.monotonic()
    workload.start()
    plans = tmp_path / "gc-plans"

    def plan(attempt: int) -> tuple[int, dict[str, Any]]:
        garbage_made = workload.record.gc_garbage_at
        while time.monotonic() - garbage_made < SAFETY_AGE_S + 2:  # S3's clock must see it old
            time.sleep(0.2)
        directory = plans / f"p{attempt}"
        return run_gc(
            tmp_path / "unused-data-dir",
            *("--plan", str(directory), "--safety-age-secs", str(SAFETY_AGE_S)),
            env=gc_env(lake),
        )

    def apply(attempt: int) -> tuple[int, dict[str, Any]]:
        directory, checkpoint = plans / f"p{attempt}", plans / f"p{attempt}.apply.json"
        return run_gc(
            tmp_path / "unused-data-dir",
            *("--plan", str(directory), "--apply", "--checkpoint", str(checkpoint)),
            env=gc_env(lake),
        )

    def collect_gc() -> None:
        workload.record.gc = run_gc_during(
            workload,
            lambda: upload_garbage(workload.record, a),
            plan,
            apply,
            lambda location: exists(lake, location),
        )

    # The replica for the nothing-lost check serves none of the workload; it starts
    # beside it (a start takes many seconds on a loaded machine), as does GC.
    fresh: list[Endpoint | BaseException] = []

    def start_fresh() -> None:
        try:
            fresh.append(endpoint(lake, "fresh", lake.start_query()))
        except BaseException as exc:  # reported by the assert below
            fresh.append(exc)

    starting = threading.Thread(target=start_fresh)
    gc = threading.Thread(target=collect_gc)
    takeover = ""
    try:
        assert workload.wait_for_appends(5, timeout_s=90), workload.record.report()
        gc.start()
        if kill_leader is None:
            starting.start()
        else:
            assert workload.wait_for_appends(15, timeout_s=90), workload.record.report()
            before = workload.record.acked()
            killed_at = time.monotonic()
            kill_leader.kill()
            _, seen_at = lake.wait_for_leader(other_than=kill_leader, timeout_s=30)
            # Everyone keeps going through the takeover, until appends land again.
            assert workload.wait_for_appends(before + 10, timeout_s=90), workload.record.report()
            takeover = f"takeover {seen_at - killed_at:.1f}s after SIGKILL"
            starting.start()  # after the takeover: starting in any order is not this test's
        while time.monotonic() - started < WORKLOAD_S or gc.is_alive():
            time.sleep(0.2)
    finally:
        workload.finish()
        gc.join(timeout=300)
        if starting.ident is not None:
            starting.join(timeout=120)
    assert fresh, "the fresh replica did not start"
    assert isinstance(fresh[0], Endpoint), f"the fresh replica did not start: {fresh[0]}"
    final = lake.admin(lambda c: c.describe_table(TABLE)).entry.descriptor.version
    lost = nothing_lost(
        workload.record,
        fresh[0],
        final,
        create_version=created,
        leftovers=lambda: open_uploads(lake),
    )
    print(takeover)
    print(workload.record.report())
    print("nothing-lost:", lost.rows, "rows,", lost.files_checked, "FILE values;", lost.problems())
    assert_workload_held(workload.record, lost)


@pytest.fixture
def cloud_fleet(make_cloud_lake: Any, monkeypatch: pytest.MonkeyPatch) -> CloudLake:
    lake: CloudLake = make_cloud_lake(query_env=QUERY_ENV)
    for key, value in lake.s3.env().items():
        monkeypatch.setenv(key, value)  # the SDK uploads and verifies FILE values itself
    return lake


def two_metasrv(lake: CloudLake) -> LakeProcess:
    first = lake.start_meta()
    leader, _ = lake.wait_for_leader()
    assert leader is first
    lake.start_meta()
    lake.start_balancer()
    return first


def test_fleet_workload_on_seaweedfs_and_dynalite(cloud_fleet: CloudLake, tmp_path: Path) -> None:
    two_metasrv(cloud_fleet)
    run_fleet(cloud_fleet, tmp_path, kill_leader=None)


def test_fleet_workload_survives_a_metasrv_leader_sigkill(
    cloud_fleet: CloudLake, tmp_path: Path
) -> None:
    leader = two_metasrv(cloud_fleet)
    run_fleet(cloud_fleet, tmp_path, kill_leader=leader)
