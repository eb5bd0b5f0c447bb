"""Outstanding-job slots and the persisted byte ceiling."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import lake_sdk
from tests.async_queries.conftest import FOREVER, SQL, AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished


def test_the_ninth_outstanding_job_of_a_tenant_is_refused_while_others_are_served(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    replica = async_lake.add_query()
    loaded(100)
    with client(replica) as acme, client(replica, "globex") as globex:
        handles = [acme.jobs.submit(f"{SQL} LIMIT {n + 1}") for n in range(8)]
        with pytest.raises(lake_sdk.ResourceExhausted) as refused:
            acme.jobs.submit(SQL)
        assert "acme" not in str(refused.value)
        # Another principal of the same tenant shares its slots.
        with client(replica, "acme2") as bob, pytest.raises(lake_sdk.ResourceExhausted):
            bob.jobs.submit(SQL)
        other = globex.jobs.query(SQL).to_table()
        assert other.num_rows == 100
        # Releasing one (cancel) frees a slot.
        assert acme.jobs.cancel(handles[0]) is True
        assert wait_finished(acme, acme.jobs.submit(SQL)).state == "done"


def test_a_result_over_its_ceiling_fails_cleanly_and_a_looser_restart_does_not_enlarge_it(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    # A tight 4 KiB ceiling (a test-only setting below LAKE_ASYNC_MAX_RESULT_BYTES' floor).
    tight = async_lake.add_query(
        {"LAKE_FAULTS": "query.async_result_bytes=4096,query.async_lease_ms=1000"}
    )
    loaded(2000)
    with client(tight) as sdk:
        failed = wait_finished(sdk, sdk.jobs.submit(SQL))
        assert failed.state == "failed"
        assert isinstance(failed.error, lake_sdk.ResultTooLarge)
        with pytest.raises(lake_sdk.ResultTooLarge):
            sdk.jobs.resume(failed)
        # Occupy the tenant's one worker slot, so the next job is stored but not started.
        blocker = wait_finished(sdk, sdk.jobs.submit(FOREVER), state="running")
        waiting = sdk.jobs.submit(SQL)
        assert sdk.jobs.poll(waiting).state == "pending"
    tight.kill()

    loose = async_lake.add_query(
        {
            "LAKE_FAULTS": "query.async_lease_ms=1000",
            "LAKE_ASYNC_WORKER_CONCURRENCY_PER_TENANT": "2",
        }
    )
    with client(loose) as sdk:
        again = wait_finished(sdk, waiting)
        assert again.state == "failed", "a looser restart enlarged the job's byte ceiling"
        assert isinstance(again.error, lake_sdk.ResultTooLarge)
        sdk.jobs.cancel(blocker)
    results = async_lake.data_dir / "async-query-results"
    assert not any(results.rglob("*.arrows")), "a failed job left result parts"
