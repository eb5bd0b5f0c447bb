"""The shell blocks of the cloud, integrity and registrar pages run as written, twice.

Each page runs through :class:`tools.lake_testing.docs.DocRun`: its own ``lake
meta``/``lake query`` lines start the servers, every other ``lake`` line must
exit 0, and only the environment the page names (ports, endpoints, the
variables it says the reader sets) is supplied by the test.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tools.lake_testing.docs import DocRun
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3
from tools.lake_testing.servers import free_port, start_meta

ROOT = Path(__file__).resolve().parents[2]


def test_integrity_page_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    page = DocRun(ROOT / "docs" / "integrity.md", tmp_path)
    for attempt in (1, 2):
        names = page.run_pass()
        assert names["version"] == attempt
        remote, local = page.printed[-2:]
        versions = ",".join(str(v) for v in range(attempt + 1))
        # The same report from the running Metasrv and from the stopped directory.
        expected = f"robots.scores: {attempt} data file(s) of version(s) {versions} checked: OK"
        assert remote.strip() == local.strip() == expected
    assert not page.servers


@pytest.mark.s3
@pytest.mark.dynamodb
def test_cloud_page_runs_twice(
    s3_server: SeaweedS3, dynamodb_server: Dynalite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s3_server.create_bucket("embodied-data")  # the page's bucket, which the reader has
    page = DocRun(
        ROOT / "docs" / "cloud.md",
        tmp_path,
        # The reader's S3 key pair; the page's own local endpoints, on the test's ports.
        env={
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        },
        ports={8333: s3_server.s3_port, 8000: dynamodb_server.port, 50053: free_port()},
    )
    for attempt in (1, 2):
        names = page.run_pass()
        assert names["version"] == attempt
        status, created, counted = page.printed[-3:]
        roles = [line.split()[2] for line in status.splitlines() if line.startswith("metasrv ")]
        assert sorted(roles) == ["follower", "leader"], status
        assert json.loads(created)["location"].startswith("s3://embodied-data/lake/tables/")
        assert f"│ {attempt} " in counted, counted  # one row per pass
    assert not page.servers


def test_gc_page_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The page's ./data: a local Lake's data directory, its Metasrv stopped, holding
    # one upload that was never appended, older than the page's safety age (a day).
    start_meta(tmp_path / "data", tmp_path).stop()
    objects = tmp_path / "data" / "objects" / "tenants" / "local" / "objects"
    objects.mkdir(parents=True)
    orphan = objects / "01a2bb00-0000-7000-8000-0000000000d0"
    orphan.write_bytes(b"o" * 3000)
    then = time.time() - 2 * 86400
    os.utime(orphan, (then, then))
    page = DocRun(ROOT / "docs" / "gc.md", tmp_path)
    for found in (1, 0):
        page.run_pass()
        planned, applied = (json.loads(out) for out in page.printed[-2:])
        assert (planned["candidates"], planned["candidate_bytes"]) == (found, 3000 * found)
        assert (applied["deleted"], applied["complete"]) == (found, True)
        assert not orphan.exists()
        # A plan is used once (the page's plan path is dated): a rerun plans anew.
        shutil.rmtree(tmp_path / "gc-plans")
