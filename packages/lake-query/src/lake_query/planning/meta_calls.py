"""Calling Metasrv from a planning thread, through the replica's own client.

The replica's :class:`~lake_core.meta_client.MetaClient` lives on its event
loop; planning runs on worker threads. A thread hands the call to the loop
and waits for it within a budget that ends before its planning deadline
(:func:`lake_core.planning_deadline.wait_budget`). On the loop itself that
wait would deadlock, so callers check :func:`on_loop` first and decide what
not asking means for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from lake_core.planning_deadline import wait_budget

__all__ = ["on_loop", "result_within"]

T = TypeVar("T")


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running ``loop`` (waiting on it here would deadlock)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def result_within(
    loop: asyncio.AbstractEventLoop, call: Coroutine[Any, Any, T], limit_s: float
) -> T:
    """``call``'s result, run on ``loop``; at most ``limit_s``, cut to the planning deadline.

    Raises what the call raises, or ``TimeoutError`` once the budget is spent,
    with the call cancelled.
    """
    future = asyncio.run_coroutine_threadsafe(call, loop)
    try:
        return future.result(wait_budget(limit_s))
    except TimeoutError:  # concurrent.futures' own, since Python 3.11
        future.cancel()
        raise
