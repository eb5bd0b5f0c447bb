"""OTLP/gRPC traces behind ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (server extra).

:func:`configure_tracing` installs the OpenTelemetry SDK provider with a
bounded batch exporter when the variable is set, and nothing otherwise.
:func:`server_span` is the SERVER span the RPC interceptor opens around
every call, continuing the caller's W3C context; :func:`resumed_span` is the
span of deferred work (an async-query job) continuing a stored one.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from importlib import metadata as distributions
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import Attributes

from lake_core.telemetry.propagation import (
    INSTRUMENTATION,
    extract,
    resumed_context,
    rpc_attributes,
    tracer,
)

__all__ = [
    "OTLP_TRACES_ENDPOINT",
    "ServerSpan",
    "Tracing",
    "configure_tracing",
    "end_server_span",
    "resumed_span",
    "server_span",
]

#: The standard OpenTelemetry variable (not a LAKE_* one): where spans go.
OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
#: Bounds of the process-owned exporter: spans beyond the queue are dropped, never buffered.
MAX_QUEUE = 2048
MAX_BATCH = 512
EXPORT_DELAY_MS = 1000
EXPORT_TIMEOUT_MS = 5000


def _version() -> str:
    try:
        return distributions.version("lake-core")
    except distributions.PackageNotFoundError:
        return "unknown"


class Tracing:
    """The installed provider; :meth:`close` flushes what is queued (bounded)."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def close(self) -> None:
        self.provider.shutdown()


def configure_tracing(service: str, env: Mapping[str, str] = os.environ) -> Tracing | None:
    """Install OTLP tracing for ``service`` when the endpoint is set; None when off."""
    endpoint = env.get(OTLP_TRACES_ENDPOINT, "").strip()
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from lake_core.telemetry.spans import HashedResource, LakeTracerProvider, ServerSpans

    resource = HashedResource(
        Resource.create({"service.name": service, "service.version": _version()})
    )
    provider = LakeTracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=MAX_QUEUE,
        max_export_batch_size=MAX_BATCH,
        schedule_delay_millis=EXPORT_DELAY_MS,
        export_timeout_millis=EXPORT_TIMEOUT_MS,
    )
    provider.add_span_processor(processor)
    # OTEL_SDK_DISABLED=true gives no-op tracers: then no lean spans either.
    if isinstance(provider.get_tracer(INSTRUMENTATION), trace.NoOpTracer):
        provider.server_spans = None
    else:
        provider.server_spans = ServerSpans(provider, processor, INSTRUMENTATION)
    trace.set_tracer_provider(provider)
    return Tracing(provider)


class ServerSpan(Protocol):
    """A started server span (:func:`server_span`); pass it to :func:`end_server_span`."""

    @property
    def token(self) -> object | None: ...

    def end(self, status_code: int, error: str | None) -> None: ...


class _SdkServerSpan:
    """A server span from the installed provider's own tracer (not Lake's provider)."""

    __slots__ = ("_span", "token")

    def __init__(self, span: Span, token: object | None) -> None:
        self._span = span
        self.token = token

    def end(self, status_code: int, error: str | None) -> None:
        if self._span.is_recording():
            self._span.set_attribute("rpc.grpc.status_code", status_code)
            if error is not None:
                self._span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        self._span.end()


class _Continued:
    """A caller's context made current, with no span of this process to record."""

    __slots__ = ("token",)

    def __init__(self, token: object | None) -> None:
        self.token = token

    def end(self, status_code: int, error: str | None) -> None:
        return None


def server_span(full_method: str, metadata: Any, *, activate: bool = True) -> ServerSpan | None:
    """Start (and, with ``activate``, make current) the SERVER span of one RPC.

    None when there is nothing to trace. Continues the W3C context
    ``metadata`` carries. Cheap when tracing is off (no span, no context
    change unless the caller sent a ``traceparent``) and lean when on
    (:mod:`lake_core.telemetry.spans`).
    """
    parent = extract(metadata)
    provider = trace.get_tracer_provider()
    lean = getattr(provider, "server_spans", None)
    if lean is not None:
        started: ServerSpan = lean.start(
            _span_name(full_method), parent, rpc_attributes(full_method), activate=activate
        )
        return started
    if not _on(provider):
        if parent is None:
            return None
        # No SDK: the caller's context continues as it came (what the API's no-op
        # tracer would make current), so outgoing calls still carry it.
        return _Continued(otel_context.attach(parent) if activate else None)
    span = tracer().start_span(
        _span_name(full_method),
        context=parent,
        kind=SpanKind.SERVER,
        attributes=rpc_attributes(full_method),
    )
    token = otel_context.attach(trace.set_span_in_context(span, parent)) if activate else None
    return _SdkServerSpan(span, token)


def end_server_span(started: ServerSpan | None, code: Any) -> None:
    """Record the final gRPC status (a ``grpc.StatusCode``), end the span, restore the context."""
    if started is None:
        return
    name = code.name
    started.end(int(code.value[0]), None if name == "OK" else name)
    token = started.token
    if token is not None:
        # Fails only for a generator finalized in another context; harmless.
        with contextlib.suppress(Exception):
            otel_context.detach(token)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=256)  # grpc routes only registered methods: a bounded set
def _span_name(full_method: str) -> str:
    return full_method.lstrip("/")


@contextlib.contextmanager
def resumed_span(
    name: str, traceparent: str | None, tracestate: str | None, attributes: Attributes = None
) -> Iterator[Span | None]:
    """A CONSUMER span, child of a stored W3C context, active for the block.

    A missing or invalid stored context starts a new trace (when tracing is
    on); with tracing off and nothing stored it yields None and costs nothing.
    """
    parent = resumed_context(traceparent, tracestate)
    if parent is None and not _on():
        yield None
        return
    # An explicit empty context: never a child of whatever the caller's task holds.
    with tracer().start_as_current_span(
        name,
        context=parent if parent is not None else otel_context.Context(),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield span


def _on(provider: trace.TracerProvider | None = None) -> bool:
    if provider is None:
        provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
