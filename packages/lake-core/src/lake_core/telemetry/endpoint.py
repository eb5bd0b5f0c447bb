"""``/metrics`` on ``LAKE_METRICS_ADDR``: a loopback-only Prometheus listener.

Parse the address with :func:`metrics_address` while validating the rest of
the configuration (before any listener binds); :func:`start_metrics_server`
then serves :data:`lake_core.telemetry.metrics.REGISTRY` from a daemon thread.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import start_http_server

from lake_core.config import METRICS_ADDR
from lake_core.errors import ConfigError
from lake_core.telemetry.metrics import REGISTRY

__all__ = ["MetricsAddress", "MetricsServer", "metrics_address", "start_metrics_server"]


@dataclass(frozen=True)
class MetricsAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def metrics_address(env: Mapping[str, str] = os.environ) -> MetricsAddress | None:
    """The validated ``LAKE_METRICS_ADDR`` (None when unset), or ConfigError."""
    raw = env.get(METRICS_ADDR, "").strip()
    if not raw:
        return None
    host, sep, port = raw.rpartition(":")
    host = host.strip("[]") if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    # An IP literal only: a name could resolve to a routable address later.
    if not sep or ip is None or not ip.is_loopback:
        raise ConfigError(
            f"{METRICS_ADDR} must be a loopback IP socket such as 127.0.0.1:9090, got {raw!r}"
        )
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"{METRICS_ADDR} needs a port in 1..=65535, got {raw!r}")
    return MetricsAddress(str(ip), int(port))


@dataclass
class MetricsServer:
    address: MetricsAddress
    _server: Any
    _thread: Any

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(address: MetricsAddress) -> MetricsServer:
    """Serve ``/metrics`` on ``address``; OSError (naming it) when it cannot bind."""
    try:
        server, thread = start_http_server(address.port, addr=address.host, registry=REGISTRY)
    except OSError as exc:
        raise OSError(f"could not bind {METRICS_ADDR} {address}: {exc.strerror}") from None
    return MetricsServer(address, server, thread)
