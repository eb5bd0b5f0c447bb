"""W3C trace context reaches the async worker, across a reclaim, and a bad header is ignored.

A test-run OTLP receiver collects the replicas' spans. The client's
``traceparent`` on the PollFlightInfo submission is continued by the
submission's SERVER span; the job record keeps that span's context (the two
W3C strings only) and the attempt that runs the job is its child, on whichever
replica claims it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import adbc_driver_flightsql.dbapi as flightsql
import boto3
import grpc
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import lake_sdk
from lake_core.proto import flight_pb2
from lake_query.jobs.workers import JOB_SPAN
from lake_sdk._jobs import _statement
from tests.async_queries.conftest import SQL, TOKENS, AsyncLake, client
from tests.async_queries.test_lifecycle import CRASHING, FAST_LEASE, wait_finished
from tests.telemetry.scrape import json_lines
from tools.lake_testing.otlp import OtlpReceiver, ReceivedSpan

POLL = "arrow.flight.protocol.FlightService/PollFlightInfo"
SERVER, CONSUMER = 2, 5  # OTLP SpanKind values
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
#: Every key a job record may hold: the previous version's, and the two W3C strings.
RECORD_KEYS = {
    "schema_version", "job_id", "tenant_key", "request_digest", "sealed", "state",
    "submitted_at", "expires_at", "max_result_bytes", "revision", "attempt", "lease_owner",
    "lease_token", "lease_expires", "cancel_requested", "manifest", "error_code",
    "error_message", "traceparent", "tracestate",
}  # fmt: skip


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    started = OtlpReceiver().start()
    try:
        yield started
    finally:
        started.stop()


def _traced(receiver: OtlpReceiver, extra: dict[str, str]) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint, **extra}


def _submit(replica_addr: str, headers: list[tuple[str, str]]) -> lake_sdk.JobHandle:
    """A raw Flight PollFlightInfo submission with the given extra metadata."""
    descriptor = flight_pb2.FlightDescriptor(
        type=flight_pb2.FlightDescriptor.CMD, cmd=_statement(SQL)
    )
    metadata = [("authorization", f"Bearer {TOKENS['acme']}"), *headers]
    with grpc.insecure_channel(replica_addr) as channel:
        poll = channel.unary_unary(
            "/" + POLL,
            request_serializer=flight_pb2.FlightDescriptor.SerializeToString,
            response_deserializer=flight_pb2.PollInfo.FromString,
        )
        reply = poll(descriptor, metadata=metadata, timeout=60)
    return lake_sdk.JobHandle(capability=reply.flight_descriptor.cmd, expires_at=time.time() + 600)


def _attempt(spans: list[ReceivedSpan], trace_id: str, attempt: int) -> ReceivedSpan | None:
    return next(
        (
            s
            for s in spans
            if s.name == JOB_SPAN
            and s.service == "lake-query"
            and s.kind == CONSUMER
            and s.trace_id == trace_id
            and s.attributes.get("lake.async.attempt") == attempt
        ),
        None,
    )


def _stored_parent(job: dict[str, object]) -> tuple[str, str]:
    """(trace id, span id) of the context a job record stores."""
    traceparent = str(job["traceparent"])
    _, trace_id, span_id, _ = traceparent.split("-")
    return trace_id, span_id


def test_adbc_submission_traceparent_reaches_the_worker_and_a_bad_one_is_ignored(
    async_lake: AsyncLake, loaded: Callable[[int], None], receiver: OtlpReceiver
) -> None:
    replica = async_lake.add_query(_traced(receiver, {**FAST_LEASE, "LAKE_LOG_FORMAT": "json"}))
    loaded(300)
    kwargs = {
        "adbc.flight.sql.authorization_header": f"Bearer {TOKENS['acme']}",
        "adbc.flight.sql.rpc.call_header.traceparent": TRACEPARENT,
    }
    with flightsql.connect(replica.url, db_kwargs=kwargs) as conn, conn.cursor() as cur:
        cur.adbc_statement.set_options(**{"adbc.statement.exec.incremental": "true"})
        partitions: list[bytes] = []
        for _ in range(100):
            found, _schema = cur.adbc_execute_partitions(SQL)
            if not found:
                break
            partitions += found
        rows = 0
        for partition in partitions:
            cur.adbc_read_partition(partition)
            rows += cur.fetch_arrow_table().num_rows
    assert rows == 300

    spans = receiver.wait_for(lambda got: _attempt(got, CLIENT_TRACE, 1) is not None)
    run = _attempt(spans, CLIENT_TRACE, 1)
    assert run is not None
    # Its parent is the submission's SERVER span, itself the client's span's child.
    [submission] = [s for s in spans if s.span_id == run.parent_id]
    assert (submission.name, submission.kind, submission.service) == (POLL, SERVER, "lake-query")
    assert (submission.trace_id, submission.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert run.attributes["db.system.name"] == "lake"
    assert SQL not in {str(v) for v in run.attributes.values()}
    [job] = async_lake.jobs()
    assert set(job) <= RECORD_KEYS
    assert _stored_parent(job) == (CLIENT_TRACE, submission.span_id)
    assert TOKENS["acme"] not in json.dumps(job)
    # The worker's log lines about the job carry the trace and the attempt's span.
    done = [r for r in json_lines(replica.log()) if r.get("event") == "async job done"]
    assert [(r.get("trace_id"), r.get("span_id")) for r in done] == [(CLIENT_TRACE, run.span_id)]

    # A malformed traceparent (and tracestate) is ignored: the job runs, in a new trace.
    bad = [("traceparent", "00-not-a-trace-context-01"), ("tracestate", "!not state!" * 400)]
    handle = _submit(replica.addr, bad)
    with client(replica) as sdk:
        assert wait_finished(sdk, handle).state == "done"
        assert sdk.jobs.resume(handle).to_table().num_rows == 300
    [second] = [j for j in async_lake.jobs() if j["job_id"] != job["job_id"]]
    fresh_trace, submission_span = _stored_parent(second)
    assert fresh_trace != CLIENT_TRACE
    assert "tracestate" not in second
    spans = receiver.wait_for(lambda got: _attempt(got, fresh_trace, 1) is not None)
    rerun = _attempt(spans, fresh_trace, 1)
    assert rerun is not None
    assert rerun.parent_id == submission_span
    [fresh] = [s for s in spans if s.span_id == submission_span]
    assert (fresh.name, fresh.parent_id) == (POLL, "")  # a root: nothing of the bad header


def _s3_mode(request: pytest.FixtureRequest) -> dict[str, str]:
    """Job state in DynamoDB (dynalite), results on S3 (SeaweedFS), as in test_s3_mode."""
    s3_server = request.getfixturevalue("s3_server")
    dynamodb_server = request.getfixturevalue("dynamodb_server")
    return {
        **s3_server.env(),
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_server.endpoint,
        "AWS_REGION": "us-east-1",
        "LAKE_S3_BUCKET": request.getfixturevalue("s3_bucket"),
        "LAKE_ASYNC_DYNAMODB_TABLE": "async_traces_test",
        "LAKE_ASYNC_RESULT_PREFIX": "results/async",
    }


def _dynamo_jobs(request: pytest.FixtureRequest) -> list[dict[str, object]]:
    """Every job record in the DynamoDB state table, as stored."""
    dynamo = boto3.client(
        "dynamodb",
        endpoint_url=request.getfixturevalue("dynamodb_server").endpoint,
        region_name="us-east-1",
        aws_access_key_id="dynalite",
        aws_secret_access_key="dynalite",
    )
    items = dynamo.scan(TableName="async_traces_test")["Items"]
    return [json.loads(i["doc"]["S"]) for i in items if i["pk"]["S"].startswith("job#")]


@pytest.mark.parametrize(
    "store", ["local", pytest.param("s3", marks=[pytest.mark.s3, pytest.mark.dynamodb])]
)
def test_a_reclaimed_job_still_continues_the_sdk_callers_trace(
    async_lake: AsyncLake,
    loaded: Callable[[int], None],
    receiver: OtlpReceiver,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    mode = _s3_mode(request) if store == "s3" else {}
    worker = async_lake.add_query(_traced(receiver, {**mode, **CRASHING}))
    loaded(3000)
    # The application's span (API only: no provider needed to propagate it).
    app = SpanContext(
        int(CLIENT_TRACE, 16),
        int(CLIENT_SPAN, 16),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque-value")]),
    )
    with client(worker) as sdk, trace.use_span(NonRecordingSpan(app)):
        handle = sdk.jobs.submit(SQL)
    assert worker.proc is not None
    assert worker.proc.wait(timeout=120) == 137  # SIGKILL-like exit after its first part

    rescuer = async_lake.add_query(_traced(receiver, {**mode, **FAST_LEASE}))
    with client(rescuer) as sdk:
        assert wait_finished(sdk, handle).state == "done"
    spans = receiver.wait_for(lambda got: _attempt(got, CLIENT_TRACE, 2) is not None)
    run = _attempt(spans, CLIENT_TRACE, 2)
    assert run is not None
    [job] = async_lake.jobs() if store == "local" else _dynamo_jobs(request)
    assert (job["state"], job["attempt"]) == ("done", 2)
    assert job["tracestate"] == "vendor=opaque-value"
    # The parent is the dead replica's submission span, as the record names it.
    assert _stored_parent(job) == (CLIENT_TRACE, run.parent_id)
    # Whether or not the dead replica exported it, the submission span is the parent.
    submission = [s for s in spans if s.span_id == run.parent_id]
    assert all(s.name == POLL and s.trace_id == CLIENT_TRACE for s in submission)
    assert run.parent_id not in ("", CLIENT_SPAN)
