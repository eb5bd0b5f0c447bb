"""Ending a DoGet whose client has stopped taking messages.

Under HTTP/2 flow control a client that stops reading makes the server's
write block once the stream window and socket buffers are full: the DoGet
generator then sits at its ``yield`` and keeps its admission permit until the
execution timeout (30 minutes by default), so a handful of never-read
streams lock a tenant out. :class:`StallClock` records when a message was
offered and not yet taken; :func:`watch_stalls` ends the stream once one has
waited ``LAKE_QUERY_STALL_TIMEOUT_MS``. Time spent producing a message (a
slow scan) is not a stall: only time spent waiting for the client counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from lake_core.config import QUERY_STALL_TIMEOUT_MS as STALL_TIMEOUT_MS

__all__ = ["DEFAULT_STALL_TIMEOUT_MS", "STALL_TIMEOUT_MS", "StallClock", "watch_stalls"]

DEFAULT_STALL_TIMEOUT_MS = 60_000

#: Checks per timeout while no message waits: a stall ends within 1.25 timeouts.
_CHECKS_PER_TIMEOUT = 4


class StallClock:
    """When the stream's current message was offered to the client (None: none waiting)."""

    __slots__ = ("_loop", "since")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.since: float | None = None

    def offered(self) -> None:
        self.since = self._loop.time()

    def taken(self) -> None:
        self.since = None


async def watch_stalls(
    clock: StallClock, timeout_ms: int, on_stall: Callable[[], Awaitable[None]]
) -> None:
    """Call ``on_stall`` once a message has waited ``timeout_ms`` for the client.

    A plain attribute write per message keeps the stream's hot path free of
    timers; the watcher wakes a few times per timeout instead.
    """
    loop = asyncio.get_running_loop()
    timeout_s = timeout_ms / 1000
    while True:
        since = clock.since
        now = loop.time()
        if since is None:
            await asyncio.sleep(timeout_s / _CHECKS_PER_TIMEOUT)
        elif now - since >= timeout_s:
            await on_stall()
            return
        else:
            await asyncio.sleep(since + timeout_s - now)
