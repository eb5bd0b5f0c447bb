"""Results over several parts while the query executes: real replica, real clients.

The worker runs the query on one thread, encodes on another and stores parts
on a third (:mod:`lake_query.jobs.parts`); these tests pin what that must
not change: the rows, the part ceiling, one manifest written after the last
part, and a retry after storage refuses a part midway.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from lake_core.tickets import TicketKeyRing
from lake_query.jobs.tags import PartTag, PartTags
from tests.async_queries.conftest import AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished
from tests.async_queries.test_transient import retries

#: ~230 bytes a row: 3,000 rows span about a dozen 64 KiB test parts.
WIDE_SQL = "SELECT episode_id, steps, reward, notes FROM robots.episodes ORDER BY steps"
PART_BYTES = 65536


def _manifest(async_lake: AsyncLake) -> tuple[Path, dict]:  # type: ignore[type-arg]
    [job] = async_lake.jobs()
    assert job["state"] == "done", job
    [manifest] = (async_lake.data_dir / "async-query-results").rglob("manifest.json")
    assert manifest.parent.parent.name == job["job_id"]
    return manifest.parent, json.loads(manifest.read_text())


def _check_parts(async_lake: AsyncLake, folder: Path, doc: dict, rows: int) -> None:  # type: ignore[type-arg]
    """Every named part is whole, tagged at its place, within the ceiling; nothing else is there."""
    tags = PartTags(TicketKeyRing.from_file(async_lake.root / "ticket-keys.json"))
    assert doc["rows"] == rows
    names = [part["name"] for part in doc["parts"]]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*names, "manifest.json"])
    for index, part in enumerate(doc["parts"]):
        data = (folder / part["name"]).read_bytes()
        assert len(data) == part["bytes"] <= PART_BYTES
        if index < len(doc["parts"]) - 1:
            assert part["bytes"] > PART_BYTES // 2  # full parts, cut only near the ceiling
        checker = tags.checker(doc["job_id"], doc["attempt"], index, PartTag(**part["tag"]))
        checker.update(data)
        assert checker.matches()


def test_a_result_over_many_parts_is_the_statements_rows(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    replica = async_lake.add_query({"LAKE_FAULTS": f"query.async_part_bytes={PART_BYTES}"})
    loaded(3000)
    with client(replica) as sdk:
        interactive = sdk.query_table(WIDE_SQL)
        handle = wait_finished(sdk, sdk.jobs.submit(WIDE_SQL))
        assert handle.state == "done", handle
        durable = sdk.jobs.resume(handle).to_table()
    assert durable.num_rows == 3000
    assert durable.equals(interactive)
    folder, doc = _manifest(async_lake)
    assert len(doc["parts"]) >= 5
    _check_parts(async_lake, folder, doc, 3000)


def test_a_part_refused_midway_is_retried_and_only_the_whole_result_is_named(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    """Storage refuses the second part after its first chunk: the try's parts go, the job
    runs again (a transient error), and its one manifest names the new complete parts."""
    replica = async_lake.add_query(
        {"LAKE_FAULTS": f"query.async_part_bytes={PART_BYTES},query.async_fail_part=2"}
    )
    loaded(3000)
    with client(replica) as sdk:
        interactive = sdk.query_table(WIDE_SQL)
        handle = wait_finished(sdk, sdk.jobs.submit(WIDE_SQL))
        assert handle.state == "done", handle
        durable = sdk.jobs.resume(handle).to_table()
    assert durable.equals(interactive)
    log = replica.log()
    assert "async result part failed by fault point" in log
    assert retries(replica) == 1
    [job] = async_lake.jobs()
    assert job["attempt"] == 1  # retried in place by the same worker, not reclaimed
    folder, doc = _manifest(async_lake)
    _check_parts(async_lake, folder, doc, 3000)
