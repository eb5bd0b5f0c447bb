"""Lake Query: stateless Arrow Flight SQL replicas over DataFusion.

Public pieces:

- :class:`~lake_query.config.QueryConfig`: flags plus ``LAKE_QUERY_*`` variables.
- :class:`~lake_query.planning.catalog_cache.CatalogCache`: the catalog, fed by Metasrv snapshots.
- :class:`~lake_query.planning.Planner`: plan with pinning, execute from pins alone.
- :class:`~lake_query.flightsql.QueryHandler`: the Flight SQL service.
- :func:`~lake_query.cli.run`: connect the catalog and serve.
"""

from lake_query.config import QueryConfig
from lake_query.flightsql import QueryHandler
from lake_query.planning import PinnedTable, PlannedQuery, Planner, QuerySpec
from lake_query.planning.catalog_cache import CachedTable, CatalogCache

__all__ = [
    "CachedTable",
    "CatalogCache",
    "PinnedTable",
    "PlannedQuery",
    "Planner",
    "QueryConfig",
    "QueryHandler",
    "QuerySpec",
]
