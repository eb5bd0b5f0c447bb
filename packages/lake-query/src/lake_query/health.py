"""What a Query replica reports on standard gRPC Health, beyond start-up and drain.

:func:`replica_serving` is the one place that decides whether the replica
can serve; today it is whether any planning thread is left
(:mod:`lake_query.planning_threads`). Every change is reported on the
server's overall status and its Flight service (the readiness probe, so
the Service stops routing here), and on :data:`PLANNING_SERVICE` alone,
which only lost planning threads turn NOT_SERVING: the liveness probe
checks it, so Kubernetes restarts a replica whose planners are all stuck
(``deploy/kubernetes/query.yaml``; a Python thread cannot be killed, a
process can).
"""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from lake_core.flight.server import FlightServer
from lake_query.planning_threads import PlanningThreads

__all__ = ["PLANNING_SERVICE", "replica_serving", "watch_health"]

#: The gRPC Health service name that reports only whether this replica can plan.
PLANNING_SERVICE = "lake.query.Planning"


def replica_serving(planning: PlanningThreads) -> bool:
    """Whether this replica can serve statements: some planning thread is not lost."""
    return planning.serving()


async def report_health(server: FlightServer, planning: PlanningThreads) -> None:
    """Set the replica's health from :func:`replica_serving` (and the planning service)."""
    serving = replica_serving(planning)
    await server.set_serving(serving)
    await server.health.set(
        PLANNING_SERVICE,
        health_pb2.HealthCheckResponse.SERVING
        if planning.serving()
        else health_pb2.HealthCheckResponse.NOT_SERVING,
    )


def watch_health(server: FlightServer, planning: PlanningThreads) -> None:
    """Report health now and whenever ``planning`` changes (call on the server's loop)."""
    loop = asyncio.get_running_loop()
    reports: set[asyncio.Task[None]] = set()

    def changed() -> None:
        task = loop.create_task(report_health(server, planning))
        reports.add(task)
        task.add_done_callback(reports.discard)

    planning.on_change = changed
    changed()
