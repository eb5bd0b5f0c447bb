"""Planning keeps bounded memory: 200,000 inventory entries, peak RSS growth under 64 MiB.

The plan runs in its own process, which reports its resident set after its
imports and its peak (``VmHWM``) at the end; the growth between the two is
what planning itself cost. Half the objects are referenced by one table
(100,000 URIs of lineage through the external sort), half are orphans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lake_core.models import DataLocation
from tests.gc.conftest import Lake

pytestmark = pytest.mark.slow

ENTRIES = 200_000
REFERENCED = 100_000
LIMIT_MIB = 64

_PLAN_AND_MEASURE = """
import json, sys
from pathlib import Path
from lake_gc import GcTarget, make_plan

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

target = GcTarget.from_env(Path(sys.argv[1]))
before = status("VmRSS")
plan = make_plan(
    Path(sys.argv[2]),
    roots=target.roots,
    sidecars=target.sidecars,
    stage=target.stage,
    safety_age_secs=0,
)
print(json.dumps({"before": before, "peak": status("VmHWM"), **plan.summary()}))
"""


def test_planning_200k_entries_stays_under_64_mib_of_growth(
    local_lake: Lake, tmp_path: Path
) -> None:
    lake = local_lake
    lake.create()
    objects = Path(lake.stage.tenant_uri("local").removeprefix("file://")) / "objects"
    objects.mkdir(parents=True)
    sha = "ab" * 32
    referenced = [
        DataLocation(
            uri=f"{lake.stage.tenant_uri('local')}/objects/{i:08d}",
            media_type="video/mp4",
            size_bytes=0,
            sha256=sha,
        )
        for i in range(REFERENCED)
    ]
    for start in range(0, REFERENCED, 10_000):  # an append holds at most 10,000 rows
        lake.append(referenced[start : start + 10_000])
    for i in range(ENTRIES):
        os.close(os.open(objects / f"{i:08d}", os.O_CREAT | os.O_WRONLY, 0o644))

    done = subprocess.run(
        [sys.executable, "-c", _PLAN_AND_MEASURE, str(lake.data), str(tmp_path / "plan")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["inventory"] == ENTRIES
    assert report["referenced"] == REFERENCED
    assert report["candidates"] == ENTRIES - REFERENCED
    growth_mib = (report["peak"] - report["before"]) / 2**20
    print(f"planning {ENTRIES} entries grew RSS by {growth_mib:.1f} MiB")
    assert growth_mib < LIMIT_MIB, f"planning grew the resident set by {growth_mib:.1f} MiB"
