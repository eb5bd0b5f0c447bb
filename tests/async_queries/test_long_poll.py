"""Held polls: a poll that asks to wait is answered when its job ends, on any replica."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import grpc
import pytest

import lake_sdk
from lake_core import protocol
from lake_core.proto import flight_pb2
from tests.async_queries.conftest import FOREVER, SQL, TOKENS, AsyncLake, client
from tests.async_queries.test_lifecycle import wait_finished
from tools.lake_testing.servers import LakeProcess

_POLL = "/arrow.flight.protocol.FlightService/PollFlightInfo"


def poll(replica: LakeProcess, handle: lake_sdk.JobHandle, wait_ms: str | None) -> str:
    """One raw PollFlightInfo of ``handle`` (with the wait header if given); the job's state."""
    metadata = [
        ("authorization", f"Bearer {TOKENS['acme']}"),
        (protocol.ASYNC_STATES_HEADER, "1"),
    ]
    if wait_ms is not None:
        metadata.append((protocol.ASYNC_WAIT_HEADER, wait_ms))
    with grpc.insecure_channel(replica.addr) as channel:
        call = channel.unary_unary(
            _POLL,
            request_serializer=flight_pb2.FlightDescriptor.SerializeToString,
            response_deserializer=flight_pb2.PollInfo.FromString,
        )
        descriptor = flight_pb2.FlightDescriptor(
            type=flight_pb2.FlightDescriptor.CMD, cmd=handle.capability
        )
        info = call(descriptor, metadata=metadata, timeout=60)
    return str(json.loads(info.info.app_metadata)["state"])


def timed(work: Callable[[], str]) -> tuple[str, float]:
    began = time.monotonic()
    state = work()
    return state, time.monotonic() - began


def test_a_held_poll_waits_for_the_end_and_a_plain_poll_does_not(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    first, second = async_lake.add_queries(None, None)
    loaded(2000)
    with client(first) as sdk:
        running = wait_finished(sdk, sdk.jobs.submit(FOREVER), state="running")
        assert running.state == "running"

        # No header: answered at once. A header: held for that long while the job runs.
        state, took = timed(lambda: poll(first, running, None))
        assert state == "running"
        assert took < 1.0
        state, took = timed(lambda: poll(first, running, "400"))
        assert state == "running"
        assert 0.35 <= took < 3.0

        # Held on both replicas; the job is cancelled through the first. The replica whose
        # process wrote the record wakes at once; the other sees it on its next read.
        answers: dict[str, tuple[str, float]] = {}

        def held(key: str, replica: LakeProcess) -> None:
            state = poll(replica, running, "4000")
            answers[key] = (state, time.monotonic())

        threads = [
            threading.Thread(target=held, args=(key, replica))
            for key, replica in (("first", first), ("second", second))
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both polls are held by now
        cancelled_at = time.monotonic()
        assert sdk.jobs.cancel(running) is True
        for thread in threads:
            thread.join(30)
        for key in ("first", "second"):
            state, answered_at = answers[key]
            assert state == "cancelled", key
            # Held until the cancel, answered soon after it: long before the 4 s asked for.
            assert cancelled_at < answered_at < cancelled_at + 1.5, (
                key,
                answered_at - cancelled_at,
            )


def test_wait_returns_the_finished_handle_and_raises_a_cancelled_jobs_error(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    replica = async_lake.add_query()
    loaded(2000)
    with client(replica) as sdk:
        done = sdk.jobs.wait(sdk.jobs.submit(SQL))
        assert done.state == "done"
        rows = sdk.jobs.resume(done).to_table()
        assert rows.num_rows == 2000

        running = wait_finished(sdk, sdk.jobs.submit(FOREVER), state="running")
        with client(replica) as other:
            canceller = threading.Timer(0.5, lambda: other.jobs.cancel(running))
            canceller.start()
            began = time.monotonic()
            with pytest.raises(lake_sdk.QueryCancelled):
                sdk.jobs.wait(running)
            canceller.join(30)
        assert time.monotonic() - began < 5.0


def test_a_malformed_wait_header_is_refused(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    replica = async_lake.add_query()
    loaded(10)
    with client(replica) as sdk:
        handle = sdk.jobs.submit(SQL)
        for header in ("abc", "-1", "1.5", " 5", "1234567890", ""):
            with pytest.raises(grpc.RpcError) as failure:
                poll(replica, handle, header)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, header
        assert poll(replica, handle, "0") in ("pending", "running", "done")
