"""A log handler that renders and writes records on its own thread.

A Query point query logs three lines (planned, admitted, stream ended) on
its critical path. Rendering one is about 10 µs, but the write releases the
GIL, and on a busy replica another thread (the event loop, a DoGet thread)
takes it: the logging thread then waits for it back, about 0.2-0.3 ms a
line on a loaded 2-core machine. Here the calling thread only queues the
record (no GIL release) and one writer thread renders and writes it, while
the caller's threads wait on the network or on Lance with the GIL free.

Records keep what the caller's context gave them: the calling thread's
context variables (request id, current span) are captured with the record
and the target handler runs inside them. :meth:`BackgroundHandler.flush`
returns once every record queued before it was written (process exit,
fault-injected crashes).
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading

__all__ = ["BackgroundHandler"]

#: How long a flush waits for the writer (a wedged stream must not hang exit).
_FLUSH_WAIT_S = 5.0


class BackgroundHandler(logging.Handler):
    """Hands every record to ``target`` on one daemon thread, in order."""

    def __init__(self, target: logging.Handler) -> None:
        super().__init__()
        self.target = target
        self._queue: queue.SimpleQueue[
            tuple[logging.LogRecord, contextvars.Context] | threading.Event | None
        ] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="lake-log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        if self._closed or not self._thread.is_alive():
            # After close (interpreter exit), or the writer died: write here, as before.
            self.target.handle(record)
            return
        self._queue.put((record, contextvars.copy_context()))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            record, context = item
            try:
                context.run(self.target.handle, record)
            except Exception:
                self.handleError(record)

    def flush(self) -> None:
        """Wait until every record queued so far was written (bounded), then flush."""
        writer = self._thread
        if not self._closed and writer.is_alive() and threading.current_thread() is not writer:
            written = threading.Event()
            self._queue.put(written)
            written.wait(_FLUSH_WAIT_S)
        self.target.flush()

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True
            self._queue.put(None)
            if threading.current_thread() is not self._thread:
                self._thread.join(_FLUSH_WAIT_S)
        self.target.close()
        super().close()

    def setFormatter(self, fmt: logging.Formatter | None) -> None:
        self.target.setFormatter(fmt)
