"""A server process's telemetry: validated at startup, started before the listener binds.

::

    telemetry = ProcessTelemetry.load("lake-query")  # ConfigError on a bad address
    telemetry.start()                                  # /metrics bound, tracing installed
    ...
    telemetry.close()                                  # spans flushed (bounded), port freed
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from lake_core.telemetry.endpoint import (
    MetricsAddress,
    MetricsServer,
    metrics_address,
    start_metrics_server,
)
from lake_core.telemetry.tracing import Tracing, configure_tracing

__all__ = ["ProcessTelemetry"]

log = structlog.get_logger("lake_core.telemetry")


@dataclass
class ProcessTelemetry:
    service: str
    metrics: MetricsAddress | None
    env: Mapping[str, str]
    _server: MetricsServer | None = field(default=None, repr=False)
    _tracing: Tracing | None = field(default=None, repr=False)

    @classmethod
    def load(cls, service: str, env: Mapping[str, str] = os.environ) -> ProcessTelemetry:
        """Validate the telemetry configuration (ConfigError), starting nothing."""
        return cls(service, metrics_address(env), dict(env))

    def start(self) -> None:
        if self.metrics is not None and self._server is None:
            self._server = start_metrics_server(self.metrics)
            log.info("metrics serving", addr=str(self.metrics), path="/metrics")
        if self._tracing is None:
            self._tracing = configure_tracing(self.service, self.env)
            if self._tracing is not None:
                log.info("tracing to OTLP", service=self.service)

    def close(self) -> None:
        if self._tracing is not None:
            self._tracing.close()
            self._tracing = None
        if self._server is not None:
            self._server.close()
            self._server = None
