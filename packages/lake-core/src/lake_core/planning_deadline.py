"""How long a wait inside planning may last: up to the statement's planning deadline.

Planning runs on a thread with a deadline
(``lake_query.serving.planning_threads``). A wait inside it that outlives
the deadline, such as asking Metasrv for data-file digests while Metasrv is
down, turns a dependency's outage into DEADLINE_EXCEEDED ("simplify it") and
leaves the thread lost until the wait ends; enough of those and the replica
reports NOT_SERVING. A wait bounded by :func:`wait_budget` gives up first, so
the caller gets the dependency's own error (UNAVAILABLE: retry) and the
thread comes back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

__all__ = ["MARGIN_S", "planning_until", "wait_budget"]

#: Left between a wait's end and the deadline, for the error to reach the caller.
MARGIN_S: Final = 0.5

#: When planning on this thread must end (time.monotonic()); None: not planning.
_deadline: ContextVar[float | None] = ContextVar("lake_planning_deadline", default=None)


@contextmanager
def planning_until(deadline: float) -> Iterator[None]:
    """Mark this thread as planning until ``deadline`` (``time.monotonic()`` seconds)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def wait_budget(limit_s: float) -> float:
    """``limit_s``, cut short to end ``MARGIN_S`` before this thread's planning deadline.

    Off a planning thread (background verification, a failed scan's
    diagnosis) it is ``limit_s`` unchanged. Never below a millisecond: a wait
    already past its budget gives up at once.
    """
    deadline = _deadline.get()
    if deadline is None:
        return limit_s
    return max(0.001, min(limit_s, deadline - MARGIN_S - time.monotonic()))
