"""Planning and running SQL over pinned Lance table versions.

Parts:

- :mod:`~lake_query.planning.spec`: what a ticket seals (``QuerySpec``, ``PinnedTable``).
- :mod:`~lake_query.planning.catalog`: the lazy per-request ``lake`` catalog (binders).
- :mod:`~lake_query.planning.external`: plug-in catalogs (``iceberg``) found by entry point.
- :mod:`~lake_query.planning.versions`: time travel (``t@v3``, ``t@<instant>``,
  ``t$versions``) from Lance's history.
- :mod:`~lake_query.planning.storage`: opening pinned versions; storage failures, typed.
- :mod:`~lake_query.planning.pinned`: the replica's cache of opened datasets.
- :mod:`~lake_query.planning.direct` and :mod:`~lake_query.planning.pushdown`: scans
  Lance answers alone.
- :mod:`~lake_query.planning.partitions`: plain scans split into fragment ranges
  (one endpoint each).
- :mod:`~lake_query.planning.limits` and :mod:`~lake_query.planning.functions`: what
  one statement may make DataFusion do (depth, size, memory, function outputs).
- :mod:`~lake_query.planning.amplification` and :mod:`~lake_query.planning.sizes`: how
  large concatenation may make a statement's values, bounded from its plan.
- :mod:`~lake_query.planning.planner`: :class:`Planner`, plan with pins, run from pins.
- :mod:`~lake_query.planning.abortable`: DataFusion batches another thread can stop
  mid-batch (async jobs).
- :mod:`~lake_query.planning.batches`: result batches sized for Flight (1-4 MB), and
  prefetching them from a blocking iterator.
- :mod:`~lake_query.planning.sql_errors`: read-only SQL, and DataFusion's errors as
  Lake errors; :mod:`~lake_query.planning.datafusion_messages`: the few DataFusion
  messages that carry a fact no typed error does.
- :mod:`~lake_query.planning.catalog_cache`: the replica's catalog, fed by Metasrv
  snapshots; :mod:`~lake_query.planning.freshness`: how fresh it must be to plan on.
- :mod:`~lake_query.planning.verify`: data files checked against their recorded
  digests before rows are served (``LAKE_QUERY_VERIFY_ON_OPEN``).

This layer imports nothing else of ``lake_query``
(``tests/packaging/test_dependency_rule.py``).
"""

from lake_query.planning.catalog import DEFAULT_SCHEMA
from lake_query.planning.limits import QueryLimits
from lake_query.planning.pinned import PinnedDatasets
from lake_query.planning.planner import Planner, ResultStream, read_only_options
from lake_query.planning.spec import (
    MAX_PARAMETER_BYTES,
    ExternalPin,
    PinnedTable,
    PlannedQuery,
    QuerySpec,
    statement_pins,
)
from lake_query.planning.storage import DatasetOpener, StorageProbe, open_pinned

__all__ = [
    "DEFAULT_SCHEMA",
    "MAX_PARAMETER_BYTES",
    "DatasetOpener",
    "ExternalPin",
    "PinnedDatasets",
    "PinnedTable",
    "PlannedQuery",
    "Planner",
    "QueryLimits",
    "QuerySpec",
    "ResultStream",
    "StorageProbe",
    "open_pinned",
    "read_only_options",
    "statement_pins",
]
