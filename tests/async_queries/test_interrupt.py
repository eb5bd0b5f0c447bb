"""Cancelling a job interrupts DataFusion mid-batch: its worker slot is free at once."""

from __future__ import annotations

import time
from collections.abc import Callable

from lake_core.config import ASYNC_WORKER_CONCURRENCY
from tests.async_queries.conftest import SQL, AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished

#: A one-row aggregate over 1.6e13 joined rows (2,000 loaded): its single batch would
#: take hours, so the job ends only if the running batch is interrupted. A sum, not a
#: count: DataFusion answers count(*) of a cross join from row-count statistics.
ENDLESS = (
    "SELECT sum(a.steps + b.steps + c.steps + d.steps) AS n FROM robots.episodes a, "
    "robots.episodes b, robots.episodes c, robots.episodes d"
)
#: Generous for a loaded machine; an uninterrupted batch would hold the slot for hours.
FREED_WITHIN_S = 60


def test_cancelling_a_running_job_frees_its_worker_slot_mid_batch(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    # One worker slot: the next job runs only once the cancelled one has let go of it.
    replica = async_lake.add_query({ASYNC_WORKER_CONCURRENCY: "1"})
    loaded(2000)
    with client(replica) as sdk:
        running = wait_finished(sdk, sdk.submit_async(ENDLESS), state="running")
        assert running.state == "running"
        cancelled_at = time.monotonic()
        assert sdk.cancel_async(running) is True
        after = wait_finished(sdk, sdk.submit_async(SQL))
        freed_in = time.monotonic() - cancelled_at
        assert after.state == "done"
        assert freed_in < FREED_WITHIN_S, f"the slot was held {freed_in:.0f} s after the cancel"
        assert sdk.resume_async(after).to_table().num_rows == 2000
        assert sdk.poll_async(running).state == "cancelled"
    [cancelled] = [job for job in async_lake.jobs() if job["state"] == "cancelled"]
    results = async_lake.data_dir / "async-query-results"
    assert not (results / str(cancelled["job_id"])).exists(), "a cancelled job kept results"
