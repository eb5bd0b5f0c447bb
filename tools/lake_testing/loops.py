"""An asyncio loop running on its own thread, for tests of code that calls into a loop.

Replicas hand work from planning threads to their event loop (and clients
from callers' threads to theirs); tests of that code need a loop that runs
while the test's own thread blocks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["loop_on_thread"]


@contextmanager
def loop_on_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """A running loop on a daemon thread; on exit the calls a test left running are
    cancelled and awaited (no "Task was destroyed" warnings), then it stops and closes."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _cancel_the_rest() -> None:
    rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
