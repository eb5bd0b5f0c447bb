"""The federation's counters: the seam the telemetry layer wires to Prometheus.

Federation counts four things and nothing else: cache hits, cache misses,
failed external loads and OAuth token renewals. The methods take no
arguments on purpose: no namespace, table, endpoint, principal or credential
can become a label. :class:`MetricsCounters` is the default: it counts into
``lake_query_iceberg_federation_events_total`` (label ``event`` only), which
Query's ``/metrics`` exports. Tests hand another object with these four
methods to ``IcebergFederation.use_counters``: the federation's REST client
and cache count through a :class:`CounterSwitch` that forwards to it.
"""

from __future__ import annotations

import threading
from typing import Protocol

from lake_core.telemetry.series import ICEBERG_FEDERATION

__all__ = [
    "CounterSwitch",
    "CountingCounters",
    "FederationCounters",
    "MetricsCounters",
    "NullCounters",
]


class FederationCounters(Protocol):
    def cache_hit(self) -> None: ...
    def cache_miss(self) -> None: ...
    def load_failure(self) -> None: ...
    def oauth_renewal(self) -> None: ...


class NullCounters:
    """Counts nothing (federation without metrics)."""

    def cache_hit(self) -> None:
        pass

    def cache_miss(self) -> None:
        pass

    def load_failure(self) -> None:
        pass

    def oauth_renewal(self) -> None:
        pass


class MetricsCounters:
    """Counts into the process's Prometheus registry (Query's ``/metrics``)."""

    def cache_hit(self) -> None:
        ICEBERG_FEDERATION.inc(event="cache_hit")

    def cache_miss(self) -> None:
        ICEBERG_FEDERATION.inc(event="cache_miss")

    def load_failure(self) -> None:
        ICEBERG_FEDERATION.inc(event="load_failure")

    def oauth_renewal(self) -> None:
        ICEBERG_FEDERATION.inc(event="oauth_renewal")


class CountingCounters:
    """In-memory counts (tests, and a reference for the Prometheus wiring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = self.misses = self.failures = self.renewals = 0

    def cache_hit(self) -> None:
        with self._lock:
            self.hits += 1

    def cache_miss(self) -> None:
        with self._lock:
            self.misses += 1

    def load_failure(self) -> None:
        with self._lock:
            self.failures += 1

    def oauth_renewal(self) -> None:
        with self._lock:
            self.renewals += 1


class CounterSwitch:
    """Forwards every count to ``target``, which can be replaced once metrics exist."""

    def __init__(self, target: FederationCounters | None = None) -> None:
        self.target: FederationCounters = MetricsCounters() if target is None else target

    def cache_hit(self) -> None:
        self.target.cache_hit()

    def cache_miss(self) -> None:
        self.target.cache_miss()

    def load_failure(self) -> None:
        self.target.load_failure()

    def oauth_renewal(self) -> None:
        self.target.oauth_renewal()
