"""Verifying a table's new version before the first query asks for it.

With ``LAKE_QUERY_VERIFY_ON_OPEN`` (the default) the first query to open a
version pays for checking the data files that version adds (one digest
request to Metasrv, one read of each new file). Under a fleet's appends a
table moves every second, so some reader pays that on almost every refresh.

The catalog learns of a new version first (a refresh, or a commit this
replica forwarded). :class:`VerifyAhead` hears of it, and for a table a query
on this replica opened within ``warm_s``, one background thread opens the new
version through the replica's :class:`~lake_query.planning.storage.DatasetOpener`:
its files are verified and, on local storage, the dataset stays open in the
pinned-dataset cache. The next query finds both done.

- Only tables this replica reads are verified ahead: a replica never reads
  every byte a fleet writes to tables nobody queries on it.
- Only the newest version a table has pending is kept: a skipped version's
  files are the next version's, or were compacted away.
- A failure is left to the query that meets it: nothing is remembered from a
  check that failed (``DataFileVerifier``), so the query checks again and
  reports a typed error itself. The thread logs and moves on.
- A query that arrives while the thread is checking a file waits for that
  file's one check (the verifier's single flight) instead of reading it twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from lake_core.errors import LakeError
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_core.telemetry import series

__all__ = ["WARM_S", "VerifyAhead"]

log = structlog.get_logger("lake_query.verify_ahead")

#: A table is verified ahead while a query opened it within this many seconds.
WARM_S = 600.0


class Opener(Protocol):
    """What :class:`VerifyAhead` needs of the replica's dataset opener."""

    def open(self, table: TableRef, descriptor: TableDescriptor, *, ahead: bool = False) -> Any: ...

    def read_within(self, descriptor: TableDescriptor, seconds: float) -> bool: ...


class VerifyAhead:
    """One background thread opening (and so verifying) new versions of warm tables."""

    def __init__(
        self,
        opener: Opener,
        *,
        warm_s: float = WARM_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._opener = opener
        self._warm_s = warm_s
        self._clock = clock
        #: Newest version waiting per table (a later offer replaces an earlier one).
        self._pending: dict[TableRef, TableDescriptor] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._busy = False
        #: Versions opened ahead, and checks that failed (for tests and logs).
        self.opened = 0
        self.failed = 0

    def __repr__(self) -> str:
        return f"VerifyAhead(warm_s={self._warm_s}, pending={len(self._pending)})"

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="lake-query-verify-ahead", daemon=True
            )
            self._thread.start()

    def offer(self, table: TableRef, descriptor: TableDescriptor) -> None:
        """The catalog moved ``table`` to ``descriptor`` (cheap; any thread or the loop)."""
        if not self._opener.read_within(descriptor, self._warm_s):
            return
        with self._cond:
            if self._closed:
                return
            self._pending[table] = descriptor
            self._cond.notify()

    def idle(self) -> bool:
        """Nothing is pending or being opened (tests wait for this)."""
        with self._cond:
            return not self._pending and not self._busy

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _next(self) -> tuple[TableRef, TableDescriptor] | None:
        with self._cond:
            self._busy = False
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            table = next(iter(self._pending))
            self._busy = True
            return table, self._pending.pop(table)

    def _run(self) -> None:
        while (item := self._next()) is not None:
            table, descriptor = item
            try:
                self._opener.open(table, descriptor, ahead=True)
            except LakeError as exc:
                # The query that opens this version checks again and reports it.
                self.failed += 1
                series.QUERY_VERIFIED_AHEAD.inc(outcome="failed")
                log.info(
                    "verify ahead did not pass",
                    table=table.qualified,
                    version=descriptor.version,
                    error=type(exc).__name__,
                )
            except Exception:
                self.failed += 1
                series.QUERY_VERIFIED_AHEAD.inc(outcome="failed")
                log.exception("verify ahead failed", table=table.qualified)
            else:
                self.opened += 1
                series.QUERY_VERIFIED_AHEAD.inc(outcome="ok")
