"""The endpoints of a query's FlightInfo: one ticket, or one per fragment range.

A partitioned scan (:mod:`lake_query.planning.partitions`) gets one sealed
ticket per fragment range, each carrying the whole pinned query plus its
fragment ids, so any replica sharing the key ring can serve any partition.
Partition tickets have their own kind, so a replica that does not know
partitions refuses them instead of serving the whole result once per
endpoint.
"""

from __future__ import annotations

from typing import Any

from lake_query.flightsql.wire import QUERY
from lake_query.planning import PlannedQuery
from lake_query.planning.partitions import partition_ids

__all__ = ["PARTITION", "fragments_of", "query_bodies"]

#: Ticket kind of one partition of a query.
PARTITION = "qp"


def query_bodies(planned: PlannedQuery) -> list[dict[str, Any]]:
    """The ticket body of every endpoint of ``planned``, in fragment order."""
    query = planned.spec.model_dump(mode="json")
    if not planned.partitions:
        return [{"k": QUERY, "q": query}]
    return [{"k": PARTITION, "q": query, "f": list(ids)} for ids in planned.partitions]


def fragments_of(body: dict[str, Any]) -> list[int] | None:
    """The fragment ids of a partition ticket's body; None for a whole-query ticket."""
    if body.get("k") != PARTITION:
        return None
    return partition_ids(body.get("f"))
