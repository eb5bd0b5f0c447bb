"""``LAKE_QUERY_VERIFY_ON_OPEN``: check each data file once before serving rows from it.

Lance has no per-page checksums, so a flipped byte in a data file can decode
into different values with no error (docs/integrity.md). With verification
on, the first time this replica opens a table version it recomputes the size
and SHA-256 of every data file it has not verified yet and compares them
with what Metasrv recorded at commit time (``lake.data_file_digests``). A
mismatch fails the query with :class:`~lake_core.errors.DataCorrupted`
(DATA_LOSS) naming table and version, never the file's URI. Data files are
immutable, so a file that matched once is remembered (bounded LRU) and not
read again; a file that failed is checked again on every open.

Files on S3 are read back through the same storage settings Lance uses.
Files with no recorded digest (written before Metasrv recorded them) are
served unverified and logged once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from lake_core.config import QUERY_VERIFY_ON_OPEN as VERIFY_ON_OPEN
from lake_core.errors import ConfigError, DataCorrupted, Internal, Unavailable
from lake_core.integrity import (
    DATA_FILE_DIGESTS,
    DataFileDigest,
    DataFileDigestsResult,
    DataFileReader,
    fragment_file_paths,
)
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_core.protocol import TableRequest
from lake_core.telemetry import series

__all__ = [
    "VERIFY_ON_OPEN",
    "DataFileVerifier",
    "MetaDigests",
    "verify_on_open",
]

log = structlog.get_logger("lake_query.verify")

#: Verified data files (and table versions) remembered per replica.
DEFAULT_CAPACITY = 100_000

#: Recorded digests of a table's data files, by path (blocking).
DigestSource = Callable[[TableRef], Mapping[str, DataFileDigest]]


def verify_on_open(env: Mapping[str, str]) -> bool:
    """Parse ``LAKE_QUERY_VERIFY_ON_OPEN`` (true/false, default false)."""
    raw = (env.get(VERIFY_ON_OPEN) or "false").strip().lower()
    if raw not in ("true", "false", "1", "0"):
        raise ConfigError(f"{VERIFY_ON_OPEN} must be true or false, got {raw[:20]!r}")
    return raw in ("true", "1")


class MetaDigests:
    """Digests from Metasrv, fetched from a worker thread through the replica's MetaClient."""

    def __init__(self, meta: Any, loop: asyncio.AbstractEventLoop, timeout_s: float = 30.0) -> None:
        self._meta = meta
        self._loop = loop
        self._timeout_s = timeout_s

    def __call__(self, table: TableRef) -> Mapping[str, DataFileDigest]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise Internal("data files are verified off the event loop")  # would deadlock
        call = self._meta.action(
            DATA_FILE_DIGESTS, TableRequest(table=table), DataFileDigestsResult
        )
        result = asyncio.run_coroutine_threadsafe(call, self._loop).result(self._timeout_s)
        return {digest.path: digest for digest in result.files}


class _Lru:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[object, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def add(self, key: object) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)


class DataFileVerifier:
    """Checks the data files of opened datasets against their recorded digests."""

    def __init__(
        self,
        digests: DigestSource,
        capacity: int = DEFAULT_CAPACITY,
        *,
        reader: DataFileReader | None = None,
    ) -> None:
        self._digests = digests
        self._reader = reader or DataFileReader()
        self._files = _Lru(capacity)
        self._versions = _Lru(capacity)
        self._recorded: dict[TableRef, Mapping[str, DataFileDigest]] = {}
        self._lock = threading.Lock()

    def check(
        self, dataset: Any, table: TableRef, descriptor: TableDescriptor, *, recheck: bool = False
    ) -> None:
        """Raise DataCorrupted unless every data file of ``dataset`` is as committed.

        ``recheck`` hashes again files already found whole (a query that failed
        while reading them asks whether they changed since).
        """
        location = descriptor.location
        version_key = (location, descriptor.incarnation, descriptor.engine_version)
        with self._lock:
            if version_key in self._versions and not recheck:
                return
        for path in fragment_file_paths(dataset.get_fragments()):
            file_key = (location, path)
            with self._lock:
                if file_key in self._files and not recheck:
                    continue
            expected = self._expected(table, path)
            if expected is not None:
                if self._digest(table, location, path) != (expected.size_bytes, expected.sha256):
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
            else:
                log.warning("data file has no recorded digest", table=table.qualified)
            with self._lock:
                self._files.add(file_key)
        with self._lock:
            self._versions.add(version_key)
        series.VERIFY_RUNS.inc(outcome="ok")

    def _digest(self, table: TableRef, location: str, path: str) -> tuple[int, str]:
        """Size and SHA-256 as stored now; ``(-1, "")`` for a file gone or unreadable."""
        try:
            return self._reader.digest(location, path)
        except FileNotFoundError:
            return -1, ""
        except OSError:
            if self._reader.is_remote(location):
                # The store did not answer: no verdict, and no rows either.
                raise Unavailable(
                    f"{table.qualified}: table storage is unreachable right now; retry"
                ) from None
            return -1, ""

    def _expected(self, table: TableRef, path: str) -> DataFileDigest | None:
        recorded = self._recorded.get(table)
        if recorded is None or path not in recorded:
            # A file committed since the last fetch: fetch again, once.
            recorded = self._digests(table)
            self._recorded[table] = recorded
        return recorded.get(path)
