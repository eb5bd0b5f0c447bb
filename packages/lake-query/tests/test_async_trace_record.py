"""The trace context a job record carries: old records load, bad values are dropped, both stores.

Only the two W3C strings are stored, and only when there is a context: an
untraced record is stored exactly as the previous version stored it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lake_core.telemetry.propagation import MAX_TRACESTATE, resumed_context
from lake_query.jobs.dynamo import DynamoStateStore
from lake_query.jobs.model import JobRecord
from lake_query.jobs.store import JOBS, LocalStateStore, StateStore
from lake_query.jobs.workers import Jobs
from tools.lake_testing.dynalite import Dynalite

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "lake=t61rcWkgMzE,other=x"

#: A job record exactly as the version before trace context wrote it.
PREVIOUS_VERSION: dict[str, Any] = {
    "schema_version": 2,
    "job_id": "0123456789abcdef0123456789abcdef",
    "tenant_key": "9" * 32,
    "request_digest": "d" * 64,
    "sealed": "c2VhbGVk",
    "state": "running",
    "submitted_at": 1700000000.0,
    "expires_at": 1700086400.0,
    "max_result_bytes": 1024,
    "revision": 3,
    "attempt": 1,
    "lease_owner": "0011223344556677",
    "lease_token": "ab" * 16,
    "lease_expires": 1700000010.0,
    "cancel_requested": False,
    "manifest": None,
    "error_code": None,
    "error_message": None,
}


def test_a_previous_versions_record_loads_and_is_stored_unchanged() -> None:
    record = JobRecord.model_validate(PREVIOUS_VERSION)
    assert (record.traceparent, record.tracestate) == (None, None)
    assert record.model_dump(mode="json") == PREVIOUS_VERSION
    assert record.next(attempt=2).model_dump(mode="json").keys() == PREVIOUS_VERSION.keys()


def test_a_traced_record_keeps_both_strings_through_every_change() -> None:
    traced = JobRecord.model_validate(
        {**PREVIOUS_VERSION, "traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    )
    claimed = traced.next(state="running", attempt=2)
    stored = claimed.model_dump(mode="json")
    assert (stored["traceparent"], stored["tracestate"]) == (TRACEPARENT, TRACESTATE)
    assert JobRecord.model_validate(stored) == claimed
    parent = resumed_context(claimed.traceparent, claimed.tracestate)
    assert parent is not None


@pytest.mark.parametrize(
    ("traceparent", "tracestate"),
    [
        ("not-a-traceparent", "a=b\n"),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x" * (MAX_TRACESTATE + 1)),
        (TRACEPARENT.upper(), 17),
        (TRACEPARENT + "-extra", ["a=b"]),
        (12345, None),
    ],
)
def test_bad_stored_trace_values_are_dropped_not_an_error(
    traceparent: object, tracestate: object
) -> None:
    record = JobRecord.model_validate(
        {**PREVIOUS_VERSION, "traceparent": traceparent, "tracestate": tracestate}
    )
    assert (record.traceparent, record.tracestate) == (None, None)
    assert "traceparent" not in record.model_dump(mode="json")


def test_an_all_zero_trace_id_is_well_formed_but_no_context() -> None:
    zero = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"
    assert JobRecord.model_validate({**PREVIOUS_VERSION, "traceparent": zero}).traceparent == zero
    assert resumed_context(zero, None) is None


async def _round_trip(store: StateStore) -> None:
    jobs = Jobs(store)
    old_id, new_id = "a" * 32, "b" * 32
    await store.write(JOBS, old_id, {**PREVIOUS_VERSION, "job_id": old_id}, None)
    traced = {**PREVIOUS_VERSION, "job_id": new_id, "traceparent": TRACEPARENT}
    await store.write(JOBS, new_id, {**traced, "tracestate": TRACESTATE}, None)
    found = await jobs.get(old_id)
    assert found is not None
    assert found[0].traceparent is None
    found = await jobs.get(new_id)
    assert found is not None
    record, revision = found
    # A claim (a compare-and-swap of the whole record) keeps the context.
    assert await jobs.swap(record, revision, record.next(attempt=record.attempt + 1))
    again = await jobs.get(new_id)
    assert again is not None
    assert (again[0].traceparent, again[0].tracestate, again[0].attempt) == (
        TRACEPARENT,
        TRACESTATE,
        2,
    )
    await store.close()


def test_local_store_round_trips_old_and_traced_records(tmp_path: Path) -> None:
    asyncio.run(_round_trip(LocalStateStore(tmp_path / "state")))


@pytest.mark.dynamodb
def test_dynamodb_store_round_trips_old_and_traced_records(
    dynamodb_server: Dynalite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dynalite")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dynalite")

    async def go() -> None:
        store = await DynamoStateStore(
            "async_trace_test", endpoint_url=dynamodb_server.endpoint, region="us-east-1"
        ).open()
        await _round_trip(store)

    asyncio.run(go())
