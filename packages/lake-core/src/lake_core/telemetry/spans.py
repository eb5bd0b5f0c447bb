"""Server spans at a fraction of the SDK's per-span cost: the hot path of every traced RPC.

The SDK's ``Tracer.start_span`` builds a mutable span (a lock, bounded
attribute, event and link lists, limits checks) that a server span never
uses: its attributes are fixed when it starts and only its status is set
when it ends. :class:`ServerSpans` keeps the ids and the start time while the
call runs, with a non-recording span of the same context active so child
spans, log lines and durable contexts see it, and hands the provider's own
batch processor one finished SDK ``ReadableSpan`` at the end. Sampling is
the provider's sampler; the batch processor and the OTLP exporter are the
standard ones, fed the same span data the SDK would build.

Only :func:`lake_core.telemetry.tracing.configure_tracing` builds one (it
owns the processor); any other provider gets the SDK's own spans.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

__all__ = ["ActiveServerSpan", "HashedResource", "LakeTracerProvider", "ServerSpans"]

_UNSET = trace.Status(trace.StatusCode.UNSET)


class ActiveServerSpan:
    """One server span while its call runs; :meth:`end` exports it (once)."""

    __slots__ = ("_attributes", "_name", "_parent", "_spans", "_start", "_token", "context")

    def __init__(
        self,
        spans: ServerSpans | None,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: Mapping[str, AttributeValue],
        token: object | None,
    ) -> None:
        self._spans = spans  # None when the sampler did not record it
        self._name = name
        self.context = context
        self._parent = parent
        self._attributes = attributes
        self._start = time.time_ns()
        self._token = token

    @property
    def token(self) -> object | None:
        """The context token to detach when the call ends (None: never made current)."""
        return self._token

    def end(self, status_code: int, error: str | None) -> None:
        """Export the span with its gRPC status (``error`` names a failed one)."""
        spans, self._spans = self._spans, None
        if spans is None:
            return
        attributes = {**self._attributes, "rpc.grpc.status_code": status_code}
        status = _UNSET if error is None else trace.Status(trace.StatusCode.ERROR, error)
        spans.processor.on_end(
            ReadableSpan(
                name=self._name,
                context=self.context,
                parent=self._parent,
                resource=spans.provider.resource,
                attributes=attributes,
                kind=SpanKind.SERVER,
                status=status,
                start_time=self._start,
                end_time=time.time_ns(),
                instrumentation_scope=spans.scope,
            )
        )


class ServerSpans:
    """Starts lean SERVER spans for one provider and its span processor."""

    def __init__(self, provider: TracerProvider, processor: SpanProcessor, scope: str) -> None:
        self.provider = provider
        self.processor = processor
        self.scope = InstrumentationScope(scope)

    def start(
        self,
        name: str,
        parent: otel_context.Context | None,
        attributes: Mapping[str, AttributeValue],
        *,
        activate: bool = True,
    ) -> ActiveServerSpan:
        """Start ``name`` as a child of ``parent`` (a new trace when None), current if ``activate``."""
        remote = trace.get_current_span(parent).get_span_context() if parent is not None else None
        if remote is not None and not remote.is_valid:
            remote = None
        ids = self.provider.id_generator
        trace_id = ids.generate_trace_id() if remote is None else remote.trace_id
        # As Tracer.start_span does: the sampler decides, and may rewrite the tracestate.
        sampled = self.provider.sampler.should_sample(
            parent, trace_id, name, SpanKind.SERVER, attributes
        )
        decision = sampled.decision
        flags = TraceFlags.SAMPLED if decision == Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        random_id = (
            ids.is_trace_id_random() if remote is None else remote.trace_flags.random_trace_id
        )
        if random_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        context = SpanContext(
            trace_id,
            ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=sampled.trace_state,
        )
        token = (
            otel_context.attach(trace.set_span_in_context(NonRecordingSpan(context), parent))
            if activate
            else None
        )
        recording = decision != Decision.DROP
        return ActiveServerSpan(
            self if recording else None,
            name,
            context,
            remote,
            sampled.attributes or {},
            token,
        )


class LakeTracerProvider(TracerProvider):
    """The SDK provider :func:`~lake_core.telemetry.tracing.configure_tracing` installs.

    ``server_spans`` is its lean server-span path (None until the processor is added).
    """

    server_spans: ServerSpans | None = None


class HashedResource(Resource):
    """A resource that hashes once: the OTLP encoder hashes every span's resource.

    ``Resource.__hash__`` serializes the attributes to JSON on each call; a
    resource never changes, so its hash is computed here once.
    """

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other)

    def __hash__(self) -> int:
        return self._hash
