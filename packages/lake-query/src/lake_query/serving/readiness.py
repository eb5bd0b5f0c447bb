"""Whether a Query replica serves statements now, and why not.

A replica can be up (bound, answering gRPC Health) and still unable to
answer statements: before it holds its first catalog snapshot (Metasrv not
reachable yet), for instance. Each such condition is a named **reason**,
set and cleared by the part of the replica that owns it; the replica
serves while no reason is set. Meanwhile:

- gRPC Health reports NOT_SERVING (so a load balancer or Kubernetes sends
  no traffic), SERVING again once the last reason clears;
- statements are refused at once with a typed, retryable
  :class:`~lake_core.errors.Unavailable` naming the reason, instead of
  waiting for a catalog that is not there.

Reasons are independent: adding one (a stuck planner pool, say) needs no
change to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog

from lake_core.errors import Unavailable

__all__ = ["CATALOG", "Readiness", "follow_health"]

log = structlog.get_logger("lake_query.readiness")

#: No catalog snapshot yet: Metasrv has not been reachable since the replica started.
CATALOG = "catalog"


class Readiness:
    """The named reasons this replica does not serve now (none: it serves). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {}
        self._watchers: list[Callable[[bool], None]] = []

    def __repr__(self) -> str:
        return f"Readiness(reasons={sorted(self._reasons)})"

    @property
    def serving(self) -> bool:
        return not self._reasons

    def reasons(self) -> dict[str, str]:
        """Each reason set now, with what it tells a client."""
        with self._lock:
            return dict(self._reasons)

    def block(self, reason: str, message: str) -> None:
        """Stop serving for ``reason`` (``message`` is what a refused client reads)."""
        with self._lock:
            was = not self._reasons
            self._reasons[reason] = message
        if was:
            log.warning("not serving", reason=reason)
            self._notify()

    def clear(self, reason: str) -> None:
        """``reason`` no longer holds; the replica serves once no other does."""
        with self._lock:
            if self._reasons.pop(reason, None) is None:
                return
            now = not self._reasons
        if now:
            log.info("serving", cleared=reason)
            self._notify()

    def check(self) -> None:
        """Refuse a statement (UNAVAILABLE, retryable) while any reason is set."""
        reasons = self._reasons
        if reasons:
            # The first reason set: the one the replica has been waiting on longest.
            raise Unavailable(next(iter(reasons.values())))

    def watch(self, on_change: Callable[[bool], None]) -> None:
        """Call ``on_change(serving)`` now and whenever serving turns on or off."""
        with self._lock:
            self._watchers.append(on_change)
        on_change(self.serving)

    def _notify(self) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher(self.serving)


def follow_health(readiness: Readiness, server: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Keep ``server``'s gRPC Health (a ``lake_core.flight.server.FlightServer``) on ``readiness``.

    Changes may come from any thread; each sets the state current when it
    runs on ``loop``, so reordered updates still end on the latest state.
    """
    tasks: set[asyncio.Task[None]] = set()

    async def apply() -> None:
        await server.set_serving(readiness.serving)

    def schedule() -> None:
        task = loop.create_task(apply())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def changed(_serving: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting
            loop.call_soon_threadsafe(schedule)

    readiness.watch(changed)
