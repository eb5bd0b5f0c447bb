"""Cancelling a job interrupts DataFusion mid-batch: its worker slot and CPU are free at once.

Ctrl-C during the blocking ``client.jobs.query`` cancels the job it submitted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest

from lake_core.config import ASYNC_WORKER_CONCURRENCY
from tests.async_queries.conftest import SQL, AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished
from tools.lake_testing.interrupts import ctrl_c_when

#: A one-row aggregate over 2.2e11 joined rows (6,000 loaded): its single batch takes
#: many minutes, so the job ends early only if the running batch is interrupted. A sum,
#: not a count: DataFusion answers count(*) of a cross join from row-count statistics.
ENDLESS = (
    "SELECT sum(a.steps + b.steps + c.steps) AS n "
    "FROM robots.episodes a, robots.episodes b, robots.episodes c"
)
#: Generous for a loaded machine; an uninterrupted batch holds its slot for minutes.
FREED_WITHIN_S = 60
#: CPU seconds per wall second of a replica with nothing running (the query uses ~2).
IDLE_CPU = 0.3


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all threads (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_idle(pid: int, within_s: float) -> float:
    """Seconds until the process used under IDLE_CPU over one second; fails after ``within_s``."""
    began = time.monotonic()
    while time.monotonic() - began < within_s:
        before = _cpu_seconds(pid)
        time.sleep(1.0)  # a measuring window, not a wait for an event
        if _cpu_seconds(pid) - before < IDLE_CPU:
            return time.monotonic() - began
    raise AssertionError("the cancelled query kept computing")


def test_cancelling_a_running_job_frees_its_worker_slot_mid_batch(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    # One worker slot: the next job runs only once the cancelled one has let go of it.
    replica = async_lake.add_query({ASYNC_WORKER_CONCURRENCY: "1"})
    loaded(6000)
    with client(replica) as sdk:
        running = wait_finished(sdk, sdk.jobs.submit(ENDLESS), state="running")
        assert running.state == "running"
        cancelled_at = time.monotonic()
        assert sdk.jobs.cancel(running) is True
        after = wait_finished(sdk, sdk.jobs.submit(SQL))
        freed_in = time.monotonic() - cancelled_at
        assert after.state == "done"
        assert freed_in < FREED_WITHIN_S, f"the slot was held {freed_in:.0f} s after the cancel"
        assert sdk.jobs.resume(after).to_table().num_rows == 6000
        assert sdk.jobs.poll(running).state == "cancelled"
        # The engine stopped too, not only the worker: the replica goes idle.
        _wait_idle(replica.pid, FREED_WITHIN_S)
    [cancelled] = [job for job in async_lake.jobs() if job["state"] == "cancelled"]
    results = async_lake.data_dir / "async-query-results"
    assert not (results / str(cancelled["job_id"])).exists(), "a cancelled job kept results"


def _states(async_lake: AsyncLake) -> list[object]:
    try:
        return [job["state"] for job in async_lake.jobs()]
    except (OSError, ValueError):  # a record being replaced as we read it
        return []


def test_ctrl_c_during_jobs_query_cancels_its_job_and_the_client_still_works(
    async_lake: AsyncLake, loaded: Callable[[int], None], sigint_raises_keyboard_interrupt: None
) -> None:
    assert threading.current_thread() is threading.main_thread()
    replica = async_lake.add_query({ASYNC_WORKER_CONCURRENCY: "1"})
    loaded(6000)
    with client(replica) as sdk:
        presser = ctrl_c_when(
            lambda: _states(async_lake) == ["running"], FREED_WITHIN_S, interval_s=0.05
        )
        with pytest.raises(KeyboardInterrupt):
            sdk.jobs.query(ENDLESS)
        assert presser.join(FREED_WITHIN_S)
        # The call cancelled the job it submitted before it returned.
        assert _states(async_lake) == ["cancelled"]
        # The client still works, and the one worker slot is free for the next job.
        assert sdk.jobs.query(SQL).to_table().num_rows == 6000
