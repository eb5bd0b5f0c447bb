"""Held polls, in process: the wait header's parse and the record-written wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from lake_core.errors import InvalidArgument
from lake_core.protocol import ASYNC_MAX_POLL_WAIT_MS
from lake_query.flightsql.handler import _poll_wait_s
from lake_query.jobs.store import JOBS, LocalStateStore
from lake_query.jobs.workers import Jobs
from tools.lake_testing.jobs import job_record


def test_the_wait_header_is_whole_milliseconds_capped_at_the_replicas_limit() -> None:
    assert _poll_wait_s(None) == 0.0
    assert _poll_wait_s("0") == 0.0
    assert _poll_wait_s("250") == 0.25
    assert _poll_wait_s(str(ASYNC_MAX_POLL_WAIT_MS)) == ASYNC_MAX_POLL_WAIT_MS / 1000
    assert _poll_wait_s("999999999") == ASYNC_MAX_POLL_WAIT_MS / 1000
    for bad in ("", "abc", "-1", "1.5", " 5", "5 ", "\u00b2", "\u0661", "1234567890"):
        with pytest.raises(InvalidArgument):
            _poll_wait_s(bad)


def test_a_waiter_wakes_when_this_process_writes_the_record_and_not_before(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        jobs = Jobs(LocalStateStore(tmp_path))
        record = job_record("a" * 32, state="running")
        assert await jobs.store.write(JOBS, record.job_id, record.model_dump(mode="json"), None)
        found = await jobs.get(record.job_id)
        assert found is not None

        # Nothing written: the wait lasts its timeout, and leaves no entry behind.
        began = time.monotonic()
        await jobs.written(record.job_id, 0.2)
        assert time.monotonic() - began >= 0.19
        assert not jobs._written

        # A write of this job's record (by this process) wakes every waiter at once.
        waiters = [asyncio.ensure_future(jobs.written(record.job_id, 5.0)) for _ in range(3)]
        other = asyncio.ensure_future(jobs.written("b" * 32, 0.5))
        await asyncio.sleep(0.05)
        began = time.monotonic()
        done = record.model_copy(update={"state": "done"})
        assert await jobs.swap(found[0], found[1], done)
        await asyncio.gather(*waiters)
        assert time.monotonic() - began < 0.5
        assert not other.done()  # another job's waiter is not woken
        await other

        # A waiter whose caller hung up (cancelled) leaves no entry behind.
        hung_up = asyncio.ensure_future(jobs.written(record.job_id, 5.0))
        await asyncio.sleep(0.05)
        hung_up.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hung_up
        assert not jobs._written

        # A failed compare-and-swap is not a write: nobody wakes.
        waiter = asyncio.ensure_future(jobs.written(record.job_id, 0.3))
        await asyncio.sleep(0.05)
        assert not await jobs.swap(found[0], found[1], done)  # stale revision
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await waiter

    asyncio.run(main())
