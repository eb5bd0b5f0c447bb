"""W3C trace context across Lake's gRPC hops, with ``opentelemetry-api`` only.

Clients put the current context in their call metadata (:func:`trace_headers`,
inside :func:`client_span`); servers continue it (:func:`extract`). Without
an installed tracer provider every span is a no-op and, with no incoming
``traceparent``, nothing is added to any call: cheap when tracing is off.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "TRACE_HEADERS",
    "client_span",
    "current_ids",
    "extract",
    "rpc_attributes",
    "trace_headers",
    "tracer",
]

#: Metadata keys the W3C propagator reads and writes.
TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "lake"


def tracer() -> trace.Tracer:
    """Lake's tracer from the installed provider (a no-op one when tracing is off)."""
    return trace.get_tracer(INSTRUMENTATION)


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


def rpc_attributes(full_method: str) -> dict[str, str]:
    """OpenTelemetry RPC semantic attributes of ``/package.Service/Method``."""
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
