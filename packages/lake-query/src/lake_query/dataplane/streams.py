"""One DoGet on the data plane, from its admission permit to its end.

The generator handed to pyarrow knows when a batch went to C++ (``yield``)
and when C++ asks for the next one (the write finished): between the two the
stream waits for the client, which is what the stall deadline measures, as
:class:`lake_query.serving.stall.StallClock` does on the grpcio path. A write blocked
in C++ cannot be interrupted from Python, so :class:`Watchdog` ends such a
stream by shutting its TCP connection down
(:func:`lake_query.dataplane.sockets.drop_connection`); pyarrow then drops
the generator and its ``finally`` releases everything. Every end (completion,
error, deadline, stall, client gone, drain) releases the permit and closes
the planner stream (its memory reservation) exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import structlog

from lake_core.errors import DeadlineExceeded, Internal, LakeError, Unavailable, wire_trailers
from lake_core.telemetry import series
from lake_query.dataplane.sockets import drop_connection
from lake_query.dataplane.statuses import flight_error
from lake_query.planning.batches import counted_rows
from lake_query.planning.planner import ResultStream
from lake_query.serving.stall import STALL_TIMEOUT_MS

__all__ = ["ServedStream", "Watchdog", "failure", "one_batch"]

log = structlog.get_logger("lake_query.dataplane")

#: Longest pause between two watchdog checks.
_MAX_CHECK_S = 1.0


def failure(context: Any, wants_codes: bool, error: LakeError) -> Exception:
    """The pyarrow exception to raise for ``error``, with Lake's trailers if asked for."""
    if wants_codes:
        for key, value in wire_trailers(error):
            context.add_trailer(key, value)
    return flight_error(error)


def one_batch(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """A metadata ticket's stream (no admission, as on the grpcio path)."""
    try:
        yield batch
    finally:
        log.info("data plane stream ended", batches=1, ended=None)


class ServedStream:
    """A running DoGet: its planner stream, permit release and wait record."""

    def __init__(
        self,
        result: ResultStream,
        release: Callable[[], None],
        *,
        peer: str,
        deadline: float,
        on_end: Callable[[ServedStream], None],
    ) -> None:
        self.result = result
        self.peer = peer
        self.deadline = deadline
        #: When the batch now with C++ was handed over (None: none waits for the client).
        self.offered_at: float | None = None
        #: Why the stream was ended from outside (deadline, stall, drain), if it was.
        self.ended: LakeError | None = None
        self._release = release
        self._on_end = on_end
        self._closed = False

    def end(self, error: LakeError) -> bool:
        """From the watchdog: end with ``error``; True if the client's write was blocked."""
        if self.ended is not None:
            return False
        self.ended = error
        self._release()  # as on the grpcio path, the permit is free at once
        if self.offered_at is not None:
            return True
        self.result.abort()
        return False

    def batches(self, context: Any, wants_codes: bool) -> Iterator[pa.RecordBatch]:
        """The generator pyarrow streams from (runs on one gRPC thread)."""
        sent = 0
        try:
            for batch in counted_rows(self.result):
                # Offered before the check, as end() marks ended before it looks at
                # offered_at: whichever runs second sees the other, so a stream ended
                # now either never yields or has its blocked write cut.
                self.offered_at = time.monotonic()
                self._check(context, wants_codes)
                sent += 1
                series.STREAMED_BYTES.inc(batch.nbytes)
                # A client gone fails the write: pyarrow then closes this generator
                # (no is_cancelled() per batch: it polls gRPC's completion queue).
                yield batch
                self.offered_at = None
            self._check(context, wants_codes)
        except LakeError as exc:
            raise failure(context, wants_codes, self.ended or exc) from None
        except flight.FlightError:
            raise
        except Exception as exc:
            log.exception("data plane stream failed", error_type=type(exc).__name__)
            raise failure(context, wants_codes, Internal("the query failed")) from None
        finally:
            self.close()
            # Tests and operators see which listener served a stream.
            ended = None if self.ended is None else self.ended.code
            log.info("data plane stream ended", batches=sent, ended=ended)

    def _check(self, context: Any, wants_codes: bool) -> None:
        if self.ended is not None:
            raise failure(context, wants_codes, self.ended)

    def close(self) -> None:
        """Release the permit and the planner stream (idempotent, on the stream's thread)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.result.close()
        finally:
            self._release()
            self._on_end(self)


class Watchdog:
    """One thread ending streams at their execution or stall deadline."""

    def __init__(self, port: int, stall_timeout_ms: int, execution_timeout_ms: int) -> None:
        self._port = port
        self._stall_s = stall_timeout_ms / 1000
        self._execution_ms = execution_timeout_ms
        self._streams: set[ServedStream] = set()
        self._lock = threading.Lock()
        self._stop = False
        self._wake = threading.Event()
        # Stalls are noticed within a quarter timeout (as lake_query.serving.stall); execution
        # deadlines, known up front, exactly.
        self._interval = min(_MAX_CHECK_S, self._stall_s / 4)
        #: When the watchdog wakes next (monotonic), set with the streams it saw.
        self._next_check = 0.0
        self._thread = threading.Thread(target=self._run, name="lake-dataplane-watch", daemon=True)
        self._thread.start()

    @property
    def streams(self) -> list[ServedStream]:
        with self._lock:
            return list(self._streams)

    def add(self, stream: ServedStream) -> None:
        with self._lock:
            self._streams.add(stream)
            # Woken only when its deadline comes before the next check: a wake-up
            # per DoGet was a thread switch (and a GIL hand-over) on every stream.
            early = stream.deadline < self._next_check
        if early:
            self._wake.set()

    def remove(self, stream: ServedStream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def end(self, stream: ServedStream, error: LakeError) -> None:
        """End ``stream`` with ``error``, cutting its connection if a write is blocked."""
        if stream.end(error) and not drop_connection(self._port, stream.peer):
            log.warning("data plane connection not found to drop", peer=stream.peer)

    def drain(self) -> int:
        """End every stream left (shutdown); return how many there were."""
        left = self.streams
        for stream in left:
            self.end(stream, Unavailable("this Query replica is shutting down; retry the query"))
        return len(left)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop:
            self._wake.clear()  # before looking: a stream added from now on wakes the wait
            self._check(time.monotonic())
            now = time.monotonic()
            wake = now + self._interval
            with self._lock:  # a stream added from now on compares with this wake
                for stream in self._streams:
                    if stream.ended is None:
                        wake = min(wake, stream.deadline)
                        offered = stream.offered_at
                        if offered is not None:
                            wake = min(wake, offered + self._stall_s)
                self._next_check = wake
            self._wake.wait(max(0.0, wake - now))

    def _check(self, now: float) -> None:
        for stream in self.streams:
            if stream.ended is not None:
                continue
            if now >= stream.deadline:
                log.warning("query execution timed out", timeout_ms=self._execution_ms)
                series.ADMISSION_TIMED_OUT.inc()
                self.end(
                    stream,
                    DeadlineExceeded(
                        f"query exceeded the execution timeout of {self._execution_ms} ms"
                    ),
                )
                continue
            offered = stream.offered_at
            if offered is not None and now - offered >= self._stall_s:
                log.warning("query client stalled", stall_timeout_ms=round(self._stall_s * 1000))
                series.ADMISSION_STALLED.inc()
                self.end(
                    stream,
                    DeadlineExceeded(
                        f"the client took no result message for {round(self._stall_s * 1000)} "
                        f"ms ({STALL_TIMEOUT_MS})"
                    ),
                )
