"""``lake gc`` in cloud mode: SeaweedFS (tables, sidecars, stage) and dynalite (registry).

A cloud Metasrv commits; GC runs as its own process with the same
LAKE_S3_*/LAKE_DYNAMODB_*/AWS_* configuration and starts no server. S3
ages come from S3's own clock, so the deleting plan uses a 2 s safety age
and the orphans are made older than that first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lake_core.cloud import DatasetStorage
from lake_core.errors import NotLeader, Unavailable
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects.settings import StageSettings
from tests.gc.conftest import EPISODES, HOUR_S, SCHEMA, SCRATCH, Lake, SteadyWriter
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import LakeProcess, free_port

pytestmark = [pytest.mark.s3, pytest.mark.dynamodb]

PREFIX = "warehouse/managed"
TABLE_PREFIX = "warehouse/tables"


class CloudLake(Lake):
    s3: Any

    def lance_uri(self, location: str) -> str:
        return DatasetStorage.from_env(self.env).lance_uri(location)

    def storage_options(self, location: str) -> dict[str, str] | None:
        return DatasetStorage.from_env(self.env).storage_options(location)

    def create(self, table: TableRef = EPISODES) -> None:
        # The first write waits for this node to take the lease.
        deadline = time.monotonic() + 60
        while True:
            try:
                self.admin(lambda c: c.create_table(table, SCHEMA))
                return
            except (NotLeader, Unavailable):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def keys(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.stage.bucket, Prefix=prefix
        )
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def exists(self, location: DataLocation) -> bool:
        key = location.uri.removeprefix(f"s3://{self.stage.bucket}/")
        return key in self.keys(key)

    def open_uploads(self) -> list[dict[str, Any]]:
        reply = self.s3.list_multipart_uploads(Bucket=self.stage.bucket)
        return list(reply.get("Uploads", []))


@pytest.fixture
def cloud_lake(
    tmp_path: Path,
    s3_server: SeaweedS3,
    s3_bucket: str,
    dynamodb_server: Dynalite,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[CloudLake]:
    env = {
        **s3_server.env(),
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_server.endpoint,
        "AWS_REGION": "us-east-1",
        "LAKE_CLOUD_MODE": "true",
        "LAKE_S3_BUCKET": s3_bucket,
        "LAKE_MANAGED_OBJECT_PREFIX": PREFIX,
        "LAKE_TABLE_PREFIX": TABLE_PREFIX,
        "LAKE_DYNAMODB_TABLE": "lake_registry",
        "LAKE_MANIFEST_DYNAMODB_TABLE": "lake_manifests",
        "LAKE_STORAGE_TIMEOUT_MS": "5000",
    }
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(key, env[key])  # this process uploads as the SDK would
    addr = f"127.0.0.1:{free_port()}"
    meta = LakeProcess(
        "meta-cloud", ["-m", "lake_metasrv", "--addr", addr], addr, tmp_path / "meta.log", env
    ).start()
    stage = StageSettings.s3(s3_bucket, PREFIX, region="us-east-1", endpoint_url=s3_server.endpoint)
    lake = CloudLake(tmp_path, tmp_path / "unused-data-dir", meta, stage, env)
    lake.s3 = s3_server.client()
    try:
        yield lake
    finally:
        meta.stop()


def open_upload(lake: CloudLake) -> str:
    """A multipart upload a killed SDK left open (one part sent, never completed)."""
    key = f"{PREFIX}/tenants/local/objects/01a2bb00-0000-7000-8000-00000000beef"
    upload = lake.s3.create_multipart_upload(Bucket=lake.stage.bucket, Key=key)
    lake.s3.upload_part(
        Bucket=lake.stage.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"p" * 64
    )
    return str(upload["UploadId"])


def test_cloud_gc_reclaims_orphans_and_uploads_and_keeps_every_reference(
    cloud_lake: CloudLake, tmp_path: Path
) -> None:
    lake = cloud_lake
    lake.create()
    kept = [lake.upload(b"a" * 1000, "a"), lake.upload(b"b" * 700, "b")]
    lake.append(kept[:1])
    lake.append(kept[1:])
    lake.admin(lambda c: c.optimize_table(EPISODES))  # its empty delta lands on S3 too
    assert any("/maintenance-" in k for k in lake.keys(f"{TABLE_PREFIX}/_lake-sidecars/"))
    orphan = lake.upload(b"o" * 300, "orphan")
    upload_id = open_upload(lake)
    lake.create(SCRATCH)
    dropped_only = lake.upload(b"d" * 200, "dropped")
    lake.append([dropped_only], SCRATCH)
    lake.admin(lambda c: c.drop_table(SCRATCH))

    # Everything is younger than an hour: nothing is a candidate, not even the upload.
    young = lake.plan(tmp_path / "young", HOUR_S).summary()
    assert young["candidates"] == 0
    assert young["younger_than_safety_age"] == 3  # orphan, upload, dropped table's object

    time.sleep(3)  # S3's clock must see the orphans older than the 2 s safety age
    plan, checkpoint = tmp_path / "p", tmp_path / "p.apply.json"
    code, reply = lake.gc("--plan", str(plan), "--safety-age-secs", "2", "--page-size", "2")
    assert code == 0, reply
    assert reply["candidates_by_kind"] == {"object": 2, "upload": 1}, reply
    assert reply["referenced"] == 2
    assert lake.exists(orphan)

    code, applied = lake.gc("--plan", str(plan), "--apply", "--checkpoint", str(checkpoint))
    assert code == 0, applied
    assert applied["complete"]
    assert not lake.exists(orphan)
    assert not lake.exists(dropped_only)
    assert lake.open_uploads() == []
    assert upload_id
    retained = lake.retained_locations()
    assert {loc.uri for loc in retained} == {k.uri for k in kept}
    for location in retained:
        assert lake.verify(location)

    # Plan and apply while a writer keeps appending FILE values: apply goes on,
    # deletes what was garbage at plan time, and keeps an old object that a
    # commit after the plan referenced (the sidecars on S3, read forward).
    garbage = lake.upload(b"s" * 10, "garbage")
    revived = lake.upload(b"r" * 10, "revived")
    time.sleep(3)
    busy = tmp_path / "busy"
    with SteadyWriter(lake) as writer:
        writer.wait_for_commits(1)
        assert lake.plan(busy, 2, page_size=1).manifest.candidates.entries == 2
        lake.append([revived])  # an object past the safety age newly referenced
        writer.wait_for_commits(2)
        done = lake.apply(busy, tmp_path / "busy.apply.json")
        writer.wait_for_commits(1)
    assert (done.checkpoint.deleted, done.checkpoint.newly_referenced) == (1, 1)
    assert not lake.exists(garbage)
    assert lake.exists(revived)
    retained = lake.retained_locations()
    assert {loc.uri for loc in retained} == {
        *(k.uri for k in kept),
        revived.uri,
        *(a.uri for a in writer.appended),
    }
    for location in retained:
        assert lake.verify(location)
