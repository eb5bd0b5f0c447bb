"""Waiting for a fact instead of sleeping for it.

A test that sleeps "long enough" for another thread, task or process to get
somewhere is slow when the machine is idle and wrong when it is busy. These
helpers poll the fact itself and fail with what was awaited once the deadline
passes. Both return the monotonic time at which the fact first held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["until", "until_async"]


def until(
    fact: Callable[[], object],
    timeout_s: float = 30.0,
    what: str = "the condition",
    *,
    interval_s: float = 0.02,
) -> float:
    """Poll ``fact`` (blocking) until it is truthy; the time it first was."""
    deadline = time.monotonic() + timeout_s
    while not fact():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic()


async def until_async(
    fact: Callable[[], object],
    timeout_s: float = 30.0,
    what: str = "the condition",
    *,
    interval_s: float = 0.005,
) -> float:
    """Poll ``fact`` on the running event loop until it is truthy; the time it first was."""
    deadline = time.monotonic() + timeout_s
    while not fact():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s} s")
        await asyncio.sleep(interval_s)
    return time.monotonic()
