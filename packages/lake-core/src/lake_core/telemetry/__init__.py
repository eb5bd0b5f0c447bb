"""Lake's production telemetry: Prometheus metrics, OTLP traces, W3C propagation.

* :mod:`lake_core.telemetry.propagation`: W3C trace context in gRPC metadata
  and client spans; ``opentelemetry-api`` only, so clients (the SDK) stay light.
* :mod:`lake_core.telemetry.metrics`: the process's metric registry, the
  closed-label metric factories and every series Lake exports (server extra).
* :mod:`lake_core.telemetry.endpoint`: ``/metrics`` on ``LAKE_METRICS_ADDR``.
* :mod:`lake_core.telemetry.tracing`: the OTLP/gRPC exporter behind
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` and the server span of every RPC.

Nothing is imported here: importing a submodule pulls only what it needs.
"""
