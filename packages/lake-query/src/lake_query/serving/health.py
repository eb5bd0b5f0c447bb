"""What a Query replica reports on standard gRPC Health, beyond start-up and drain.

Whether the replica serves is its :class:`~lake_query.serving.readiness.Readiness`:
one named reason per condition that stops it (no catalog yet, every
planning thread lost, ...). :func:`watch_health` turns lost planning
threads (:mod:`lake_query.serving.planning_threads`) into the :data:`PLANNING`
reason, so the server's overall status and its Flight service (the
readiness probe, so the Service stops routing here) follow it like any
other reason; and it reports :data:`PLANNING_SERVICE` alone, which only
lost planning threads turn NOT_SERVING: the liveness probe checks it, so
Kubernetes restarts a replica whose planners are all stuck
(``deploy/kubernetes/query.yaml``; a Python thread cannot be killed, a
process can). A replica waiting for its catalog is not restarted for it.
"""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from lake_core.flight.server import FlightServer
from lake_query.serving.planning_threads import PlanningThreads
from lake_query.serving.readiness import Readiness

__all__ = ["PLANNING", "PLANNING_SERVICE", "watch_health"]

#: The gRPC Health service name that reports only whether this replica can plan.
PLANNING_SERVICE = "lake.query.Planning"
#: The readiness reason set while every planning thread is lost.
PLANNING = "planning"
_LOST = (
    "every planning thread of this Query replica is busy with a statement past its "
    "planning deadline (LAKE_QUERY_PLANNING_TIMEOUT_MS); retry on another replica"
)


async def report_planning(server: FlightServer, planning: PlanningThreads) -> None:
    """Set :data:`PLANNING_SERVICE` from whether any planning thread is left."""
    await server.health.set(
        PLANNING_SERVICE,
        health_pb2.HealthCheckResponse.SERVING
        if planning.serving()
        else health_pb2.HealthCheckResponse.NOT_SERVING,
    )


def watch_health(server: FlightServer, planning: PlanningThreads, readiness: Readiness) -> None:
    """Report planning now and whenever ``planning`` changes (call on the server's loop)."""
    loop = asyncio.get_running_loop()
    reports: set[asyncio.Task[None]] = set()

    def changed() -> None:
        if planning.serving():
            readiness.clear(PLANNING)
        else:
            readiness.block(PLANNING, _LOST)
        task = loop.create_task(report_planning(server, planning))
        reports.add(task)
        task.add_done_callback(reports.discard)

    planning.on_change = changed
    changed()
