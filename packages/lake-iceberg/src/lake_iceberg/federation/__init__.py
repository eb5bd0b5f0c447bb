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

from lake_iceberg.federation.config import FederationConfig
from lake_iceberg.federation.counters import CountingCounters, FederationCounters, NullCounters
from lake_iceberg.federation.provider import CATALOG, IcebergFederation, IcebergTable

__all__ = [
    "CATALOG",
    "CountingCounters",
    "FederationConfig",
    "FederationCounters",
    "IcebergFederation",
    "IcebergTable",
    "NullCounters",
]
