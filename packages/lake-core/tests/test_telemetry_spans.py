"""Lean server spans (lake_core.telemetry.spans) export what the SDK's own spans export.

And :meth:`RpcObservation.begin`, the per-RPC entry point of servers that are
not grpc.aio, measures the call and leaves the caller's context as it was.

Differential: the same call traced through the SDK tracer and through
:class:`ServerSpans`, with the same ids, for every parent kind (none, sampled,
not sampled, with a tracestate, invalid), several samplers and a failed
status, must give byte-identical OTLP (start and end times aside), the same
active context during the call, and the same context afterwards.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import grpc
import pytest
import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from lake_core.telemetry.metrics import REGISTRY
from lake_core.telemetry.propagation import INSTRUMENTATION, extract, rpc_attributes, trace_headers
from lake_core.telemetry.rpc import RpcObservation
from lake_core.telemetry.spans import HashedResource, ServerSpans
from lake_core.telemetry.tracing import _SdkServerSpan, end_server_span

METHOD = "/arrow.flight.protocol.FlightService/DoGet"
PARENT = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "none": (),
    "sampled": (("traceparent", f"00-{PARENT}-00f067aa0ba902b7-01"),),
    "not sampled": (("traceparent", f"00-{PARENT}-00f067aa0ba902b7-00"),),
    "tracestate": (
        ("traceparent", f"00-{PARENT}-00f067aa0ba902b7-01"),
        ("tracestate", "lake=1,other=x"),
    ),
    "invalid": (("traceparent", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"),),
}
SAMPLERS: dict[str, Sampler] = {
    "default": ParentBased(ALWAYS_ON),
    "off": ALWAYS_OFF,
    "ratio": ParentBased(TraceIdRatioBased(0.5)),
}
CODES = (grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED)


class _FixedIds(IdGenerator):
    """The same ids on both sides; trace ids on both sides of the ratio sampler's bound."""

    def __init__(self, trace_id: int) -> None:
        self._trace_id = trace_id
        self._span_ids = itertools.count(0x1000)

    def generate_span_id(self) -> int:
        return next(self._span_ids)

    def generate_trace_id(self) -> int:
        return self._trace_id

    def is_trace_id_random(self) -> bool:
        return True  # as the SDK's RandomIdGenerator: a flag in the W3C context


def _provider(sampler: Sampler, trace_id: int) -> tuple[TracerProvider, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=sampler,
        resource=Resource.create({"service.name": "lake-test"}),
        id_generator=_FixedIds(trace_id),
    )
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return provider, exported


def _sdk_call(
    provider: TracerProvider, metadata: tuple[tuple[str, str], ...], code: grpc.StatusCode
) -> tuple[tuple[tuple[str, str], ...], otel_context.Context]:
    """What server_span/end_server_span do with a provider other than Lake's."""
    parent = extract(metadata)
    span = provider.get_tracer(INSTRUMENTATION).start_span(
        METHOD.lstrip("/"),
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes=rpc_attributes(METHOD),
    )
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    inside = trace_headers()
    end_server_span(_SdkServerSpan(span, token), code)
    return inside, otel_context.get_current()


def _lean_call(
    provider: TracerProvider,
    exported: InMemorySpanExporter,
    metadata: tuple[tuple[str, str], ...],
    code: grpc.StatusCode,
) -> tuple[tuple[tuple[str, str], ...], otel_context.Context]:
    spans = ServerSpans(provider, SimpleSpanProcessor(exported), INSTRUMENTATION)
    started = spans.start(METHOD.lstrip("/"), extract(metadata), rpc_attributes(METHOD))
    inside = trace_headers()
    end_server_span(started, code)
    return inside, otel_context.get_current()


def _otlp(spans: tuple[ReadableSpan, ...]) -> bytes:
    request = encode_spans(spans)
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                assert 0 < span.start_time_unix_nano <= span.end_time_unix_nano
                span.start_time_unix_nano = span.end_time_unix_nano = 0
    return bytes(request.SerializeToString(deterministic=True))


def _cases() -> Iterator[tuple[str, str, grpc.StatusCode, int]]:
    for parent, sampler, code in itertools.product(PARENTS, SAMPLERS, CODES):
        for trace_id in (1, 2**127):  # below and above the 0.5 ratio's bound
            yield parent, sampler, code, trace_id


@pytest.mark.parametrize(("parent", "sampler", "code", "trace_id"), list(_cases()))
def test_lean_server_spans_export_what_the_sdk_exports(
    parent: str, sampler: str, code: grpc.StatusCode, trace_id: int
) -> None:
    before = otel_context.get_current()
    sdk_provider, sdk_exported = _provider(SAMPLERS[sampler], trace_id)
    lean_provider, lean_exported = _provider(SAMPLERS[sampler], trace_id)

    sdk_inside, sdk_after = _sdk_call(sdk_provider, PARENTS[parent], code)
    lean_inside, lean_after = _lean_call(lean_provider, lean_exported, PARENTS[parent], code)

    sdk_spans, lean_spans = sdk_exported.get_finished_spans(), lean_exported.get_finished_spans()
    assert len(lean_spans) == len(sdk_spans)
    assert _otlp(lean_spans) == _otlp(sdk_spans)
    # What children, log lines and durable contexts see during the call.
    assert lean_inside == sdk_inside
    assert lean_after == sdk_after == before


def test_the_default_sampler_exports_one_span_with_the_grpc_conventions() -> None:
    provider, exported = _provider(ParentBased(ALWAYS_ON), 7)
    inside, _ = _lean_call(provider, exported, PARENTS["sampled"], grpc.StatusCode.NOT_FOUND)
    (span,) = exported.get_finished_spans()
    assert span.name == METHOD.lstrip("/")
    assert span.kind == trace.SpanKind.SERVER
    assert span.parent is not None
    assert format(span.parent.trace_id, "032x") == PARENT
    assert span.parent.is_remote
    assert dict(span.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": "arrow.flight.protocol.FlightService",
        "rpc.method": "DoGet",
        "rpc.grpc.status_code": grpc.StatusCode.NOT_FOUND.value[0],
    }
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == INSTRUMENTATION
    assert dict(inside)["traceparent"].startswith(f"00-{PARENT}-{span.context.span_id:016x}-")


def _rpc_count(code: str) -> float:
    labels = {"service": "flight", "method": "DoGet", "code": code}
    return REGISTRY.get_sample_value("lake_rpc_duration_seconds_count", labels) or 0.0


@pytest.mark.parametrize("activate", [True, False])
def test_an_observation_begun_outside_grpc_aio_is_measured_and_restores_context(
    activate: bool,
) -> None:
    """What a server that is not grpc.aio (a pyarrow data plane) calls per RPC."""
    before = otel_context.get_current()
    count = _rpc_count("UNAVAILABLE")
    in_flight = REGISTRY.get_sample_value("lake_rpc_in_flight")
    observed = RpcObservation.begin(METHOD, PARENTS["sampled"], activate=activate)
    assert REGISTRY.get_sample_value("lake_rpc_in_flight") == (in_flight or 0) + 1
    inside = dict(trace_headers())
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    if activate:  # the caller's trace continues in whatever the call does
        assert inside["traceparent"].split("-")[1] == PARENT
        assert isinstance(request_id, str)
        assert len(request_id) == 16
    else:
        assert inside == {}
        assert request_id is None
    observed.end(grpc.StatusCode.UNAVAILABLE)
    assert _rpc_count("UNAVAILABLE") == count + 1
    assert REGISTRY.get_sample_value("lake_rpc_in_flight") == in_flight
    assert otel_context.get_current() == before
    assert "request_id" not in structlog.contextvars.get_contextvars()


def test_a_hashed_resource_is_the_resource_it_wraps_for_the_encoder() -> None:
    plain = Resource.create({"service.name": "lake-test", "service.version": "1"})
    hashed = HashedResource(plain)
    assert hashed == plain
    assert hash(hashed) == hash(plain)
    assert dict(hashed.attributes) == dict(plain.attributes)
    assert hashed.schema_url == plain.schema_url
    provider, exported = _provider(ParentBased(ALWAYS_ON), 9)
    spans = ServerSpans(provider, SimpleSpanProcessor(exported), INSTRUMENTATION)
    for _ in range(3):
        end_server_span(spans.start("x", None, rpc_attributes(METHOD)), grpc.StatusCode.OK)
    finished = exported.get_finished_spans()
    relabelled = tuple(
        ReadableSpan(
            name=s.name,
            context=s.context,
            resource=hashed if i % 2 else plain,
            attributes=s.attributes,
            kind=s.kind,
            start_time=s.start_time,
            end_time=s.end_time,
            instrumentation_scope=s.instrumentation_scope,
        )
        for i, s in enumerate(finished)
    )
    (resource_spans,) = encode_spans(relabelled).resource_spans  # one resource, not two
    assert len(resource_spans.scope_spans[0].spans) == 3
