"""GC planning throughput on S3: ``lake gc`` planning against a raw listing of the same bucket.

- ``gc_plan``: objects/s of :func:`lake_gc.make_plan` over 100,000 S3
  objects in SeaweedFS (the inventory paged through ``ListObjectsV2`` and
  ``ListMultipartUploads``, every entry through the external sort, half of
  them referenced by a sidecar's lineage, the other half written out as
  fsync'd candidate pages), against a raw boto3 ``list_objects_v2``
  paginator over the same prefix that touches every key and size. Same
  bucket, same run, alternating. Goal: >= 0.8.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lake_core.names import TableRef
from lake_core.references import ReferenceDelta
from lake_gc import make_plan
from lake_gc.lineage import LocalSidecars
from lake_gc.roots import RegistryRoots, RootsSource
from lake_gc.stage import S3Stage
from tools.bench.harness import Figure, at_least, measure, pairs_for, warmup_for
from tools.lake_testing.seaweed import SeaweedS3

BUCKET = "lake-gc-bench"
PREFIX = "managed"


class _NoTables(RootsSource):
    """A registry with no tables: the bench's lineage is one (unregistered, so live) sidecar."""

    def read(self) -> RegistryRoots:
        return RegistryRoots(registry="bench", generation="bench:0", tables=[], dropped=[])


def _fill(client: Any, count: int) -> list[str]:
    keys = [f"{PREFIX}/tenants/bench/objects/{i:08d}" for i in range(count)]

    def put(chunk: list[str]) -> None:
        for key in chunk:
            client.put_object(Bucket=BUCKET, Key=key, Body=b"x")

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(put, [keys[i : i + 500] for i in range(0, count, 500)]))
    return keys


def run(quick: bool) -> list[Figure]:
    count = 5_000 if quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = SeaweedS3(root / "weed").start()
        try:
            server.create_bucket(BUCKET)
            client = server.client()
            keys = _fill(client, count)
            sidecars = root / "sidecars"
            (sidecars / "bench").mkdir(parents=True)
            delta = ReferenceDelta(
                table=TableRef("bench", "t"),
                incarnation="bench",
                version=0,
                adds=[f"s3://{BUCKET}/{k}" for k in keys[::2]],
            )
            (sidecars / "bench" / "0.json").write_text(json.dumps(delta.model_dump(mode="json")))
            stage = S3Stage(BUCKET, PREFIX, client)
            source = LocalSidecars(sidecars)
            plans = root / "plans"
            made = 0

            def lake() -> float:
                nonlocal made
                made += 1
                target = plans / str(made)
                began = time.perf_counter()
                plan = make_plan(
                    target, roots=_NoTables(), sidecars=source, stage=stage, safety_age_secs=0
                )
                elapsed = time.perf_counter() - began
                assert plan.manifest.inventory.entries == count
                shutil.rmtree(target)
                return count / elapsed

            def reference() -> float:
                began = time.perf_counter()
                seen = 0
                total = 0
                paginator = client.get_paginator("list_objects_v2")
                for page in paginator.paginate(
                    Bucket=BUCKET,
                    Prefix=f"{PREFIX}/tenants/",
                    PaginationConfig={"PageSize": 1000},
                ):
                    for item in page.get("Contents", []):
                        seen += 1
                        total += item["Size"] + len(item["Key"])
                elapsed = time.perf_counter() - began
                assert seen == count
                return count / elapsed

            return [
                measure(
                    "gc_plan",
                    lake,
                    reference,
                    unit="objects/s",
                    goal=at_least(0.8, ">= 0.8x a raw list_objects_v2 paginator"),
                    pairs=pairs_for(quick),
                    warmup=warmup_for(quick),
                )
            ]
        finally:
            server.stop()
