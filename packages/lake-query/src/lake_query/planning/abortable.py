"""DataFusion batches that another thread can abort while one is being computed.

The C stream interface (``RecordBatchReader.from_stream``) blocks inside
DataFusion until the next batch exists: an aggregate over a large join
computes its one batch for as long as the whole query runs, and nothing can
interrupt it. DataFusion's async stream can be: awaiting its next batch is a
Rust future, and cancelling the awaiting task drops that future, which stops
the operators at their next yield point; dropping the stream then aborts the
tasks it spawned. So each batch is awaited on a private event loop owned by
the iterating thread, and :meth:`AbortableBatches.abort` (any thread)
cancels the wait. Async jobs use this; interactive streams keep the C stream
(a client that leaves ends its stream between batches). Limit: DataFusion
cannot be preempted, so a plan that rarely yields (several nested cross
joins) keeps computing until its next yield, after the caller has moved on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from lake_core.errors import QueryCancelled

__all__ = ["AbortableBatches"]


class AbortableBatches(Iterator[pa.RecordBatch]):
    """Iterate on one thread; :meth:`abort` from any other."""

    def __init__(self, df: Any) -> None:
        self._stream: Any = df.execute_stream()
        self._loop: asyncio.AbstractEventLoop | None = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._waiting: asyncio.Task[Any] | None = None
        self._aborted = False

    def __repr__(self) -> str:
        return f"AbortableBatches(aborted={self._aborted})"

    def __next__(self) -> pa.RecordBatch:
        if self._loop is None:
            raise StopIteration
        try:
            batch = self._loop.run_until_complete(self._next())
        except StopAsyncIteration:
            self.close()
            raise StopIteration from None
        except asyncio.CancelledError:
            self.close()
            raise QueryCancelled("the query was cancelled") from None
        except BaseException:
            self.close()
            raise
        return batch.to_pyarrow()

    async def _next(self) -> Any:
        task = asyncio.ensure_future(self._stream.__anext__())
        with self._lock:
            if self._aborted:
                task.cancel()
            self._waiting = task
        try:
            return await task
        finally:
            with self._lock:
                self._waiting = None

    def abort(self) -> None:
        """Stop the batch being computed (and every later one)."""
        with self._lock:
            self._aborted = True
            task, loop = self._waiting, self._loop
        if task is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        """Drop the stream (its spawned tasks end) and the loop, on the iterating thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        self._stream = None
        if loop is not None:
            loop.close()
