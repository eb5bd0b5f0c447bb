"""``LAKE_QUERY_VERIFY_ON_OPEN`` (default on): check each data file once before serving rows.

Lance has no per-page checksums, so a flipped byte in a data file can decode
into different values with no error (docs/integrity.md). With verification
on, the first time a query on this replica reads a data file, the replica
recomputes its size and SHA-256 and compares them with what Metasrv recorded
at commit time (``lake.data_file_digests``, asked only for the files not yet
verified). A mismatch fails the query with
:class:`~lake_core.errors.DataCorrupted` (DATA_LOSS) naming table and
version, never the file's URI.

Incremental: data files are immutable, so a file that matched is remembered
(bounded LRU keyed by table location, incarnation and path, holding the
digest it matched) and not read again; opening a new version of a table
reads only the files this replica has not verified (after an append: the
new ones). Concurrent first uses of one file read it once (single flight).
A file that failed is not remembered and is checked again on every open.

Files on S3 are read back through the same storage settings Lance uses.
Files with no recorded digest (written before Metasrv recorded them) are
served unverified and logged once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import structlog

from lake_core.config import QUERY_VERIFY_ON_OPEN as VERIFY_ON_OPEN
from lake_core.errors import (
    ConfigError,
    DataCorrupted,
    Internal,
    InvalidArgument,
    Unavailable,
    VersionReclaimed,
)
from lake_core.integrity import (
    DATA_FILE_DIGESTS,
    MAX_DIGEST_PATHS,
    DataFileDigest,
    DataFileDigestsRequest,
    DataFileDigestsResult,
    DataFileReader,
    fragment_file_paths,
)
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_core.planning_deadline import wait_budget
from lake_core.protocol import TableRequest
from lake_core.telemetry import series
from lake_query.planning.meta_calls import on_loop, result_within

__all__ = [
    "VERIFY_ON_OPEN",
    "DataFileVerifier",
    "MetaDigests",
    "verify_on_open",
]

log = structlog.get_logger("lake_query.verify")

#: First and longest pause between digest requests while Metasrv is unavailable.
RETRY_BACKOFF_S = 0.1
RETRY_BACKOFF_MAX_S = 1.0

#: Verified data files (and table versions) remembered per replica.
DEFAULT_CAPACITY = 100_000

#: Recorded digests of some of a table's data files, by path (blocking).
DigestSource = Callable[[TableRef, Sequence[str]], Mapping[str, DataFileDigest]]

#: What one file's check found: its digest matched, differed, none was recorded,
#: or the file is gone (retention or GC reclaimed the version: not corruption).
_OK, _MISMATCH, _UNRECORDED, _MISSING = "ok", "mismatch", "unrecorded", "missing"


def verify_on_open(env: Mapping[str, str]) -> bool:
    """Parse ``LAKE_QUERY_VERIFY_ON_OPEN`` (true/false, default true)."""
    raw = (env.get(VERIFY_ON_OPEN) or "true").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise ConfigError(f"{VERIFY_ON_OPEN} must be true or false, got {raw[:20]!r}")
    return raw in ("true", "1")


class MetaDigests:
    """Digests from Metasrv, fetched from a worker thread through the replica's MetaClient."""

    def __init__(self, meta: Any, loop: asyncio.AbstractEventLoop, timeout_s: float = 30.0) -> None:
        self._meta = meta
        self._loop = loop
        self._timeout_s = timeout_s
        #: Whether Metasrv takes ``paths`` (every Metasrv of this release does).
        self._by_path = True

    def __call__(self, table: TableRef, paths: Sequence[str]) -> Mapping[str, DataFileDigest]:
        if on_loop(self._loop):
            raise Internal("data files are verified off the event loop")  # would deadlock
        found: dict[str, DataFileDigest] = {}
        for start in range(0, len(paths), MAX_DIGEST_PATHS):
            chunk = list(paths[start : start + MAX_DIGEST_PATHS])
            if self._by_path:
                try:
                    result = self._ask(DataFileDigestsRequest(table=table, paths=chunk))
                except InvalidArgument:
                    # A Metasrv older than this replica (a rolling upgrade) knows
                    # only the whole-table form: use it from now on.
                    log.info("Metasrv returns digests only for whole tables")
                    self._by_path = False
            if not self._by_path:
                result = self._ask(TableRequest(table=table))
            wanted = set(chunk)
            found.update((d.path, d) for d in result.files if d.path in wanted)
        return found

    def _ask(self, request: TableRequest | DataFileDigestsRequest) -> DataFileDigestsResult:
        """Ask Metasrv, riding out a takeover: the action only reads, so retrying is safe.

        A Metasrv leader that dies mid-call (or a balancer with no leader behind
        it yet) answers UNAVAILABLE for the seconds a takeover takes; a read must
        not fail for that, so calls are retried with backoff until ``timeout_s``,
        or until just before the statement's planning deadline.
        """
        deadline = time.monotonic() + wait_budget(self._timeout_s)
        backoff = RETRY_BACKOFF_S
        while True:
            call = self._meta.action(DATA_FILE_DIGESTS, request, DataFileDigestsResult)
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                return result_within(self._loop, call, remaining)
            except TimeoutError:
                raise Unavailable(
                    "Metasrv did not return data-file digests in time to verify the "
                    "table's files; retry"
                ) from None
            except Unavailable:
                if time.monotonic() + backoff >= deadline:
                    raise
            log.info("Metasrv unavailable for data-file digests; retrying", backoff_s=backoff)
            time.sleep(backoff)
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)


class _Lru:
    """Keys (with a value each) in least-recently-used order, at most ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[object, object] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key: object) -> object:
        return self._keys.get(key)

    def add(self, key: object, value: object = None) -> None:
        self._keys[key] = value
        self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def discard(self, key: object) -> None:
        self._keys.pop(key, None)


class DataFileVerifier:
    """Checks the data files of opened datasets against their recorded digests.

    Thread-safe: queries open datasets on planning threads. Blocking (reads
    files and asks Metasrv), so never called on the event loop.
    """

    def __init__(
        self,
        digests: DigestSource,
        capacity: int = DEFAULT_CAPACITY,
        *,
        reader: DataFileReader | None = None,
    ) -> None:
        self._digests = digests
        self._reader = reader or DataFileReader()
        #: (location, incarnation, path) -> the (size, sha256) it matched (None: unrecorded).
        self._files = _Lru(capacity)
        #: (location, incarnation, Lance fragment id) whose data files are all verified.
        #: Listing a fragment's files costs far more than its id, and a version
        #: lists every fragment of the table; Lake never adds files to an existing
        #: fragment (no column merges: appends and compaction make new fragments).
        self._fragments = _Lru(capacity)
        #: (location, incarnation, engine version) whose every file is verified.
        self._versions = _Lru(capacity)
        #: Checks running now, by file key: later callers wait for the first one's verdict.
        self._flights: dict[tuple[str, str, str], Future[str]] = {}
        self._lock = threading.Lock()

    def check(
        self, dataset: Any, table: TableRef, descriptor: TableDescriptor, *, recheck: bool = False
    ) -> None:
        """Raise DataCorrupted unless every data file of ``dataset`` is as committed.

        Only files this replica has not verified yet are read. ``recheck``
        hashes again files already found whole (a query that failed while
        reading them asks whether they changed since).
        """
        location, incarnation = descriptor.location, descriptor.incarnation
        version_key = (location, incarnation, descriptor.engine_version)
        with self._lock:
            if version_key in self._versions and not recheck:
                return
        fragments = dataset.get_fragments()
        with self._lock:
            unverified = [
                fragment
                for fragment in fragments
                if recheck or (location, incarnation, fragment.fragment_id) not in self._fragments
            ]
        paths = list(dict.fromkeys(fragment_file_paths(unverified)))
        with self._lock:
            pending = [
                path
                for path in paths
                if recheck or (location, incarnation, path) not in self._files
            ]
        if pending:
            # One request for the digests of every file this version adds to the set.
            expected = self._digests(table, pending)
            for path in pending:
                verdict = self._check_file(
                    table, location, incarnation, path, expected.get(path), recheck=recheck
                )
                if verdict == _MISSING:
                    raise VersionReclaimed(
                        f"{table.qualified} version {descriptor.version} is no longer available "
                        "(retention reclaimed it, or the table was dropped); run the query again "
                        "to read the current version"
                    )
                if verdict == _MISMATCH:
                    with self._lock:
                        self._versions.discard(version_key)
                    series.VERIFY_RUNS.inc(outcome="mismatch")
                    log.error(
                        "data file differs from its commit",
                        table=table.qualified,
                        version=descriptor.version,
                    )
                    raise DataCorrupted(
                        f"{table.qualified} version {descriptor.version}: a data file is "
                        "not what its commit wrote; no rows were served from it"
                    )
            series.VERIFY_RUNS.inc(outcome="ok")
        with self._lock:
            for fragment in unverified:
                self._fragments.add((location, incarnation, fragment.fragment_id))
            self._versions.add(version_key)

    def _check_file(
        self,
        table: TableRef,
        location: str,
        incarnation: str,
        path: str,
        expected: DataFileDigest | None,
        *,
        recheck: bool = False,
    ) -> str:
        """One file's verdict, computed once however many queries ask at the same time."""
        key = (location, incarnation, path)
        with self._lock:
            if not recheck and key in self._files:
                # Verified since the caller listed it (by another query, or ahead).
                return _OK if self._files.get(key) is not None else _UNRECORDED
            flight = self._flights.get(key)
            owner = flight is None
            if flight is None:
                flight = self._flights[key] = Future()
        if not owner:
            return flight.result()  # the first caller's verdict (or its Unavailable)
        try:
            verdict = self._verdict(table, location, path, expected)
        except BaseException as exc:
            with self._lock:
                self._flights.pop(key, None)
            flight.set_exception(exc)
            raise
        with self._lock:
            if verdict in (_MISMATCH, _MISSING):
                self._files.discard(key)
            else:
                matched = None if expected is None else (expected.size_bytes, expected.sha256)
                self._files.add(key, matched)
            self._flights.pop(key, None)
        flight.set_result(verdict)
        return verdict

    def _verdict(
        self, table: TableRef, location: str, path: str, expected: DataFileDigest | None
    ) -> str:
        if expected is None:
            log.warning("data file has no recorded digest", table=table.qualified)
            series.QUERY_VERIFIED_FILES.inc(outcome=_UNRECORDED)
            return _UNRECORDED
        try:
            size, sha = self._reader.digest(location, path)
        except FileNotFoundError:
            return _MISSING
        except OSError:
            if self._reader.is_remote(location):
                # The store did not answer: no verdict, and no rows either.
                raise Unavailable(
                    f"{table.qualified}: table storage is unreachable right now; retry"
                ) from None
            size, sha = -1, ""  # there but unreadable: not what the commit wrote
        series.QUERY_VERIFIED_BYTES.inc(max(size, 0))
        if (size, sha) != (expected.size_bytes, expected.sha256):
            series.QUERY_VERIFIED_FILES.inc(outcome=_MISMATCH)
            return _MISMATCH
        series.QUERY_VERIFIED_FILES.inc(outcome=_OK)
        return _OK
