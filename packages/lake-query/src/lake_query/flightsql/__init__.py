"""Lake Query's Flight SQL service.

Parts: :mod:`~lake_query.flightsql.wire` (commands, descriptors, tickets),
:mod:`~lake_query.flightsql.discovery` (catalog metadata and SQL info),
:mod:`~lake_query.flightsql.statements` (prepared-statement handles),
:mod:`~lake_query.flightsql.appends` (appends forwarded to Metasrv) and
:mod:`~lake_query.flightsql.handler` (the :class:`QueryHandler` itself).
"""

from lake_query.flightsql.appends import AppendSink
from lake_query.flightsql.handler import QueryHandler
from lake_query.flightsql.wire import MAX_SQL_BYTES

__all__ = ["MAX_SQL_BYTES", "AppendSink", "QueryHandler"]
