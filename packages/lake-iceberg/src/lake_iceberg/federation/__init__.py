"""Read-only federation of an external Iceberg REST catalog into Lake SQL.

Parts:

- :mod:`~lake_iceberg.federation.config`: the ``LAKE_ICEBERG_*`` variables, validated.
- :mod:`~lake_iceberg.federation.rest`: the bounded REST client (OAuth single flight).
- :mod:`~lake_iceberg.federation.cache`: the replica's snapshot cache (planning only).
- :mod:`~lake_iceberg.federation.scan`: a pinned snapshot as a DataFusion provider,
  pruned by manifest statistics.
- :mod:`~lake_iceberg.federation.filters`: DataFusion filters as pyiceberg expressions.
- :mod:`~lake_iceberg.federation.provider`: :class:`IcebergFederation`, what Query calls.
- :mod:`~lake_iceberg.federation.counters`: the counters seam for Prometheus.
- :mod:`~lake_iceberg.federation.plugin`: the ``lake.query.plugins`` entry point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lake_iceberg.federation.config import FederationConfig
from lake_iceberg.federation.counters import CountingCounters, FederationCounters, NullCounters

if TYPE_CHECKING:
    from lake_iceberg.federation.provider import CATALOG, IcebergFederation, IcebergTable

#: Imported on first use: the provider pulls in pyiceberg (about a quarter of a Query
#: replica's start-up), and Query loads this package's plug-in entry point whether or
#: not federation is configured.
_PROVIDER = frozenset({"CATALOG", "IcebergFederation", "IcebergTable"})

__all__ = [
    "CATALOG",
    "CountingCounters",
    "FederationConfig",
    "FederationCounters",
    "IcebergFederation",
    "IcebergTable",
    "NullCounters",
]


def __getattr__(name: str) -> Any:
    if name in _PROVIDER:
        from lake_iceberg.federation import provider

        return getattr(provider, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
