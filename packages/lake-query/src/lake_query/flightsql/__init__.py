"""Lake Query's Flight SQL service.

Parts: :mod:`~lake_query.flightsql.wire` (commands, descriptors, tickets),
:mod:`~lake_query.flightsql.discovery` (catalog metadata and SQL info, answered
by :mod:`~lake_query.flightsql.catalogs` and :mod:`~lake_query.flightsql.sqlinfo`),
:mod:`~lake_query.flightsql.statements` (prepared-statement handles),
:mod:`~lake_query.flightsql.appends` (appends forwarded to Metasrv),
:mod:`~lake_query.flightsql.stage` (the managed stage: descriptors, read
capabilities, FILE values in appends) and
:mod:`~lake_query.flightsql.handler` (the :class:`QueryHandler` itself).
"""

from lake_query.flightsql.appends import AppendSink
from lake_query.flightsql.handler import QueryHandler
from lake_query.flightsql.wire import MAX_SQL_BYTES

__all__ = ["MAX_SQL_BYTES", "AppendSink", "QueryHandler"]
