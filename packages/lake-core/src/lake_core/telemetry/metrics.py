"""Every metric a Lake process exports, and the factories that enforce closed labels.

Metrics live in one process-wide :data:`REGISTRY` (with CPU, RSS and open
file descriptors from prometheus-client's process collector); the
``/metrics`` endpoint (:mod:`lake_core.telemetry.endpoint`) serves it.

A label's values are declared with the metric and checked on every use, so
no caller can turn a metric into a channel for SQL, tenants, principals,
table names, URIs, operation ids or tokens. Adding a series::

    from lake_core.telemetry.metrics import counter

    GC_RUNS = counter("lake_gc_runs_total", "GC passes by outcome.",
                      {"outcome": ("ok", "failed")})
    GC_RUNS.inc(outcome="ok")

Recording is always on (an increment is a lock and an add); only serving
needs ``LAKE_METRICS_ADDR``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client import Counter as _PromCounter
from prometheus_client import Gauge as _PromGauge
from prometheus_client import Histogram as _PromHistogram

__all__ = [
    "REGISTRY",
    "STATUS_CODES",
    "Counter",
    "Gauge",
    "Histogram",
    "counter",
    "gauge",
    "histogram",
]

#: The registry ``/metrics`` serves.
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)

LabelSets = Mapping[str, Sequence[str]]
#: gRPC status code names, the values of every ``code`` label.
STATUS_CODES: tuple[str, ...] = tuple(code.name for code in grpc.StatusCode)
#: Series pre-created at zero (so alerts see them before the first event) up to this many.
PRECREATE_MAX = 64
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

_made: dict[str, _Metric] = {}


class _Metric:
    """A prometheus-client metric whose label values come from declared, closed sets."""

    kind = "metric"

    def __init__(self, metric: Any, name: str, labels: LabelSets) -> None:
        self._metric = metric
        self.name = name
        self.labels = {key: frozenset(values) for key, values in labels.items()}
        self._order = tuple(labels)
        self._children: dict[tuple[str, ...], Any] = {}
        combos = math.prod(len(v) for v in labels.values()) if labels else 0
        if 0 < combos <= PRECREATE_MAX:
            for values in itertools.product(*(labels[k] for k in self._order)):
                self._child(values)

    def _child(self, values: tuple[str, ...]) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child

    def _select(self, labels: Mapping[str, str]) -> Any:
        if not self._order:
            if labels:
                raise ValueError(f"{self.name} takes no labels, got {sorted(labels)}")
            return self._metric
        if labels.keys() != self.labels.keys():
            raise ValueError(
                f"{self.name} takes labels {sorted(self.labels)}, got {sorted(labels)}"
            )
        values = tuple(labels[key] for key in self._order)
        for key, value in zip(self._order, values, strict=True):
            if value not in self.labels[key]:
                # Never echo the value: it may be exactly what must not leak.
                raise ValueError(f"{self.name}: a value outside the closed set of label {key!r}")
        return self._child(values)


class Counter(_Metric):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._select(labels).inc(amount)


class Gauge(_Metric):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self._select(labels).set(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._select(labels).inc(amount)

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self._select(labels).dec(amount)

    def set_function(self, fn: Callable[[], float]) -> None:
        """Read the value from ``fn`` at each scrape (the latest call wins)."""
        self._select({}).set_function(fn)


class Histogram(_Metric):
    kind = "histogram"

    def observe(self, value: float, **labels: str) -> None:
        self._select(labels).observe(value)

    def observer(self, **labels: str) -> Callable[[float], None]:
        """``observe`` for one checked label set, to keep where a hot path reuses it."""
        child: Callable[[float], None] = self._select(labels).observe
        return child


def _check_name(name: str, labels: LabelSets) -> None:
    if not name.startswith("lake_"):
        raise ValueError(f"Lake metric names start with lake_, got {name!r}")
    for key, values in labels.items():
        if not values:
            raise ValueError(f"{name}: label {key!r} needs a non-empty closed set of values")


def _make(kind: type[_Metric], name: str, build: Callable[[], Any], labels: LabelSets) -> Any:
    existing = _made.get(name)
    if existing is not None:
        # Idempotent for the same declaration (a module imported twice under tests).
        if type(existing) is not kind or existing.labels != {
            k: frozenset(v) for k, v in labels.items()
        }:
            raise ValueError(f"metric {name} is already declared differently")
        return existing
    _check_name(name, labels)
    metric = kind(build(), name, labels)
    _made[name] = metric
    return metric


def counter(name: str, doc: str, labels: LabelSets | None = None) -> Counter:
    """A counter (``name`` ends in ``_total``) with closed label sets."""
    if not name.endswith("_total"):
        raise ValueError(f"counter names end in _total, got {name!r}")
    sets = dict(labels or {})
    base = name.removesuffix("_total")
    result: Counter = _make(
        Counter, name, lambda: _PromCounter(base, doc, tuple(sets), registry=REGISTRY), sets
    )
    return result


def gauge(name: str, doc: str, labels: LabelSets | None = None) -> Gauge:
    """A gauge with closed label sets."""
    sets = dict(labels or {})
    result: Gauge = _make(
        Gauge, name, lambda: _PromGauge(name, doc, tuple(sets), registry=REGISTRY), sets
    )
    return result


def histogram(
    name: str,
    doc: str,
    labels: LabelSets | None = None,
    *,
    buckets: Sequence[float] = LATENCY_BUCKETS,
) -> Histogram:
    """A histogram (latencies in seconds by default) with closed label sets."""
    sets = dict(labels or {})
    result: Histogram = _make(
        Histogram,
        name,
        lambda: _PromHistogram(name, doc, tuple(sets), registry=REGISTRY, buckets=tuple(buckets)),
        sets,
    )
    return result
