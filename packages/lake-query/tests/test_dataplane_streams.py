"""A data-plane stream's ends, without a server: the watchdog's ``end`` and a late grant."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from lake_core.errors import DeadlineExceeded
from lake_query.dataplane.server import release_if_granted
from lake_query.dataplane.streams import ServedStream, Watchdog
from tools.lake_testing.loops import loop_on_thread

BATCH = pa.record_batch({"x": pa.array([1, 2, 3])})


class _Result:
    """A planner stream of three batches; ``during`` runs while the second is made."""

    def __init__(self) -> None:
        self.during: Any = None
        self.aborted = 0
        self.closed = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for index in range(3):
            if index == 1 and self.during is not None:
                self.during()
            yield BATCH

    def abort(self) -> None:
        self.aborted += 1

    def close(self) -> None:
        self.closed += 1


class _Context:
    def add_trailer(self, key: str, value: str) -> None:
        pass


def _stream(result: _Result, released: list[int], ended: list[ServedStream]) -> ServedStream:
    return ServedStream(
        result,  # type: ignore[arg-type]
        lambda: released.append(1),
        peer="ipv4:127.0.0.1:1",
        deadline=float("inf"),
        on_end=ended.append,
    )


def test_a_stream_ended_while_making_a_batch_never_offers_it() -> None:
    result, released, ended = _Result(), [], []
    stream = _stream(result, released, ended)
    # The watchdog ends the stream while the planner makes batch 2: no write is blocked,
    # so the planner is aborted and batch 2 must never reach the client.
    result.during = lambda: stream.end(DeadlineExceeded("query exceeded the execution timeout"))
    batches = stream.batches(_Context(), wants_codes=False)
    assert next(batches) is BATCH
    with pytest.raises(flight.FlightTimedOutError, match="execution timeout"):
        next(batches)
    assert result.aborted == 1
    assert result.closed == 1
    assert ended == [stream]
    assert released  # released at the end() and again (idempotently) at close


def test_end_reports_a_write_blocked_on_the_client() -> None:
    result, released, ended = _Result(), [], []
    stream = _stream(result, released, ended)
    batches = stream.batches(_Context(), wants_codes=False)
    next(batches)  # with C++ now, waiting for the client
    assert stream.end(DeadlineExceeded("stalled")) is True
    assert result.aborted == 0  # the connection is cut instead
    assert stream.end(DeadlineExceeded("again")) is False  # ended once
    batches.close()
    assert result.closed == 1


def test_a_permit_granted_after_the_wait_ran_out_is_released() -> None:
    with loop_on_thread() as loop:
        released = threading.Event()

        class _Permit:
            def release_if_unwaited(self) -> bool:
                return False  # someone queues: the release goes to the loop

            def release(self) -> None:
                released.set()

        granted: Future[Any] = Future()
        granted.set_result(_Permit())
        release_if_granted(loop, granted)
        assert released.wait(5)

        refused: Future[Any] = Future()
        refused.set_exception(RuntimeError("queue full"))
        release_if_granted(loop, refused)  # nothing to release, nothing raised
        cancelled: Future[Any] = Future()
        cancelled.cancel()
        release_if_granted(loop, cancelled)


def test_the_watchdog_wakes_for_a_deadline_before_its_next_check_only() -> None:
    """A near deadline is met at once; a far one waits for the periodic check (no wake-up)."""
    watchdog = Watchdog(port=1, stall_timeout_ms=60_000, execution_timeout_ms=50)
    try:
        time.sleep(0.05)  # the watchdog is waiting for its next check, 1 s away
        far, near = _stream(_Result(), [], []), _stream(_Result(), [], [])
        far.deadline = time.monotonic() + 3600
        watchdog.add(far)
        assert not watchdog._wake.is_set()
        near.deadline = time.monotonic() + 0.05
        began = time.monotonic()
        watchdog.add(near)
        while near.ended is None:
            assert time.monotonic() - began < 0.5, "the near deadline waited for the next check"
            time.sleep(0.005)
        assert isinstance(near.ended, DeadlineExceeded)
        assert far.ended is None
    finally:
        watchdog.close()
