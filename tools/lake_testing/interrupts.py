"""Pressing Ctrl-C in a test: SIGINT to the main thread once a fact holds.

Use with the ``sigint_raises_keyboard_interrupt`` fixture (tools.lake_testing.plugin),
which makes SIGINT raise KeyboardInterrupt in the main thread whatever handler
the test run installed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CtrlC", "ctrl_c_when"]


@dataclass
class CtrlC:
    """The thread that presses Ctrl-C, and whether it did."""

    thread: threading.Thread
    pressed: threading.Event = field(default_factory=threading.Event)

    def join(self, timeout_s: float) -> bool:
        """Wait for the presser; whether it pressed."""
        self.thread.join(timeout_s)
        return self.pressed.is_set()


def ctrl_c_when(ready: Callable[[], object], within_s: float, *, interval_s: float = 0.02) -> CtrlC:
    """Start a thread that sends SIGINT to the main thread once ``ready()`` is truthy.

    It gives up silently after ``within_s`` (the test then sees no
    KeyboardInterrupt and :meth:`CtrlC.join` returns False).
    """
    pressed = threading.Event()

    def press() -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if ready():
                pressed.set()
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                return
            time.sleep(interval_s)

    thread = threading.Thread(target=press, name="ctrl-c", daemon=True)
    ctrl_c = CtrlC(thread, pressed)
    thread.start()
    return ctrl_c
