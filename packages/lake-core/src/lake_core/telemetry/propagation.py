"""W3C trace context across Lake's gRPC hops, with ``opentelemetry-api`` only.

Clients put the current context in their call metadata (:func:`trace_headers`,
inside :func:`client_span`); servers continue it (:func:`extract`). Work
that runs later in another process (async-query jobs) stores the two W3C
strings with :func:`durable_context` and continues them with
:func:`resumed_context`. Without
an installed tracer provider every span is a no-op and, with no incoming
``traceparent``, nothing is added to any call: cheap when tracing is off.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "MAX_TRACESTATE",
    "TRACE_HEADERS",
    "checked_traceparent",
    "checked_tracestate",
    "client_span",
    "current_ids",
    "durable_context",
    "extract",
    "resumed_context",
    "rpc_attributes",
    "trace_headers",
    "tracer",
]

#: Metadata keys the W3C propagator reads and writes.
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "lake"
#: ``traceparent`` as the propagator writes it (version 00): all a durable record may hold.
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
#: Longest ``tracestate`` kept in durable records: the size W3C asks every hop to carry.
MAX_TRACESTATE = 512
_TRACESTATE = re.compile(r"[\x20-\x7e]+")


#: The tracer of the provider it came from: the SDK builds a new Tracer on every
#: ``get_tracer`` call, and every RPC asks for one.
_tracer: tuple[trace.TracerProvider, trace.Tracer] | None = None


def tracer() -> trace.Tracer:
    """Lake's tracer from the installed provider (a no-op one when tracing is off)."""
    global _tracer
    provider = trace.get_tracer_provider()
    cached = _tracer
    if cached is None or cached[0] is not provider:
        cached = _tracer = (provider, provider.get_tracer(INSTRUMENTATION))
    return cached[1]


def trace_headers() -> tuple[tuple[str, str], ...]:
    """``traceparent``/``tracestate`` of the current span; empty without a valid one."""
    if not trace.get_current_span().get_span_context().is_valid:
        return ()
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return tuple(carrier.items())


def extract(metadata: Iterable[tuple[str, str | bytes]]) -> otel_context.Context | None:
    """The remote parent a call's metadata carries, or None when it carries none."""
    carrier: dict[str, str] = {}
    for key, value in metadata:
        if key in TRACE_HEADERS and key not in carrier:
            carrier[key] = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    if "traceparent" not in carrier:
        return None
    return _PROPAGATOR.extract(carrier)


@functools.lru_cache(maxsize=256)
def rpc_attributes(full_method: str) -> Mapping[str, str]:
    """OpenTelemetry RPC semantic attributes of ``/package.Service/Method`` (shared: read only)."""
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


@contextmanager
def client_span(
    full_method: str, attributes: Mapping[str, str] | None = None
) -> Iterator[tuple[tuple[str, str], ...]]:
    """A CLIENT span for one outgoing RPC; yields the trace headers to send with it.

    ``attributes`` adds fixed, non-workload attributes (database conventions).
    """
    if not _tracing_on():
        yield trace_headers()
        return
    name = full_method.lstrip("/")
    with tracer().start_as_current_span(
        name, kind=SpanKind.CLIENT, attributes={**rpc_attributes(full_method), **(attributes or {})}
    ) as span:
        yield trace_headers()
        _ok(span)


def _ok(span: Span) -> None:
    if span.is_recording():
        span.set_status(Status(StatusCode.UNSET))


def _tracing_on() -> bool:
    # The API's default provider is a proxy to a no-op one until an SDK is installed.
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` hex of the current span, for log lines; None without one."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def checked_traceparent(value: object) -> str | None:
    """``value`` if it is a version-00 ``traceparent``, else None (a bad one is ignored)."""
    if isinstance(value, str) and _TRACEPARENT.fullmatch(value):
        return value
    return None


def checked_tracestate(value: object) -> str | None:
    """``value`` if it is a printable ``tracestate`` of at most :data:`MAX_TRACESTATE`."""
    if isinstance(value, str) and len(value) <= MAX_TRACESTATE and _TRACESTATE.fullmatch(value):
        return value
    return None


def durable_context() -> tuple[str | None, str | None]:
    """``(traceparent, tracestate)`` of the current span, to store with deferred work.

    Only the two W3C strings, re-encoded by the propagator from a valid span
    (never the caller's raw header) and bounded; ``(None, None)`` without one.
    """
    headers = dict(trace_headers())
    parent = checked_traceparent(headers.get("traceparent"))
    if parent is None:
        return None, None
    return parent, checked_tracestate(headers.get("tracestate"))


def resumed_context(traceparent: str | None, tracestate: str | None) -> otel_context.Context | None:
    """The remote parent a stored context names; None when absent or not valid."""
    parent = checked_traceparent(traceparent)
    if parent is None:
        return None
    carrier = {"traceparent": parent}
    state = checked_tracestate(tracestate)
    if state is not None:
        carrier["tracestate"] = state
    resumed = _PROPAGATOR.extract(carrier)
    if not trace.get_current_span(resumed).get_span_context().is_valid:
        return None  # e.g. an all-zero trace id: well-formed, but no context
    return resumed
