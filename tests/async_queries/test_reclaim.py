"""A worker SIGKILLed mid-job: another replica reclaims the lease and finishes the job."""

from __future__ import annotations

import json
from collections.abc import Callable

from lake_core.tickets import TicketKeyRing
from lake_query.jobs.tags import PartTag, PartTags
from tests.async_queries.conftest import SQL, AsyncLake, client
from tests.async_queries.test_lifecycle import CRASHING, FAST_LEASE, wait_finished


def test_a_dead_workers_job_is_reclaimed_and_no_manifest_names_a_partial_result(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    worker = async_lake.add_query(CRASHING)
    loaded(3000)
    with client(worker) as sdk:
        interactive = sdk.query_table(SQL)
        handle = sdk.jobs.submit(SQL)
    assert worker.proc is not None
    # The crash point exits like SIGKILL once the first part is stored.
    assert worker.proc.wait(timeout=120) == 137
    results = async_lake.data_dir / "async-query-results"
    [job] = async_lake.jobs()
    assert job["state"] == "running"
    assert job["attempt"] == 1
    first_attempt = results / str(job["job_id"]) / "1"
    assert list(first_attempt.glob("part-*.arrows")), "the worker died before storing a part"
    assert not (first_attempt / "manifest.json").exists()

    rescuer = async_lake.add_query(FAST_LEASE)
    with client(rescuer) as sdk:
        assert wait_finished(sdk, handle).state == "done"
        assert sdk.jobs.resume(handle).to_table().equals(interactive)
    [job] = async_lake.jobs()
    assert job["attempt"] == 2
    assert "async job claimed" in rescuer.log()
    # Every manifest names complete parts only, with their exact size and tag.
    tags = PartTags(TicketKeyRing.from_file(async_lake.root / "ticket-keys.json"))
    manifests = list(results.rglob("manifest.json"))
    assert [m.parent.name for m in manifests] == ["2"]
    for manifest in manifests:
        doc = json.loads(manifest.read_text())
        assert doc["rows"] == 3000
        for index, part in enumerate(doc["parts"]):
            data = (manifest.parent / part["name"]).read_bytes()
            assert len(data) == part["bytes"]
            checker = tags.checker(doc["job_id"], doc["attempt"], index, PartTag(**part["tag"]))
            checker.update(data)
            assert checker.matches()
        assert len(doc["parts"]) >= 2
