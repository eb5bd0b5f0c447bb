"""One event loop on one daemon thread, shared by every blocking client (as lancedb's).

A blocking call submits its coroutine to this loop and waits for the result.
If the wait is interrupted (Ctrl-C raises KeyboardInterrupt in the calling
thread), the coroutine's task is cancelled and the call waits briefly for it
to unwind before re-raising, so the work it started does not go on running
behind the caller's back.

The loop starts on first use. A forked child (multiprocessing, Ray) does not
inherit the parent's thread, so it starts its own loop on first use there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

__all__ = ["CANCEL_WAIT_S", "BackgroundLoop"]

T = TypeVar("T")

#: How long an interrupted call waits for its cancelled task to unwind.
CANCEL_WAIT_S = 5.0


class BackgroundLoop:
    """An asyncio loop running forever on a daemon thread; :meth:`shared` is the one clients use."""

    _shared: ClassVar[BackgroundLoop | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="lake-sdk-loop", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"BackgroundLoop({self._thread.name!r}, alive={self._thread.is_alive()})"

    @classmethod
    def shared(cls) -> BackgroundLoop:
        """The process's loop (started on first use, and again in a forked child)."""
        with cls._shared_lock:
            current = cls._shared
            if current is None or current._pid != os.getpid():
                current = cls._shared = cls()
            return current

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and return its result; cancel it if the wait is interrupted."""
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise RuntimeError("a blocking Lake call cannot run on the SDK's own event loop thread")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        task: list[asyncio.Task[T]] = []

        def start() -> None:
            started = self.loop.create_task(coro)
            task.append(started)
            started.add_done_callback(lambda t: _copy_outcome(t, done))

        def cancel() -> None:
            # Callbacks run in order: if ``start`` was scheduled, it has run.
            if task:
                task[0].cancel()
            else:  # interrupted before ``start`` was scheduled: nothing ran
                coro.close()
                done.cancel()
                done.set_running_or_notify_cancel()

        try:
            self.loop.call_soon_threadsafe(start)
            return done.result()
        except BaseException:
            if not done.done():
                # Interrupted (KeyboardInterrupt from Ctrl-C, or an exception a signal
                # handler raised): cancel the task and let it unwind before re-raising.
                self.loop.call_soon_threadsafe(cancel)
                concurrent.futures.wait([done], timeout=CANCEL_WAIT_S)
            raise


def _copy_outcome(task: asyncio.Task[T], done: concurrent.futures.Future[T]) -> None:
    if task.cancelled():
        # cancel() alone wakes result() but not concurrent.futures.wait(): notify it too.
        done.cancel()
        done.set_running_or_notify_cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())
