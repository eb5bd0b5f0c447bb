"""Decoded batches of recent direct scans, sent again without reading Lance.

Training reads the same pinned version epoch after epoch. A pinned version
never changes, so the batches one direct scan produced
(:mod:`~lake_query.planning.direct`: columns of one Lance table, maybe a
filter Lance evaluates, maybe one partition's fragments) are exactly the
batches the same scan produces again. The cache keeps them, keyed by
everything that decides the rows and their batching (:class:`ScanKey`), and
a repeated scan replays the list: no Lance decoding, no merging, no copy.

Bounds (``LAKE_QUERY_SCAN_CACHE_BYTES``; 0 is no cache):

- Everything the cache keeps alive counts against the bound: kept scans
  and scans being kept while they stream. Bytes are Arrow buffers, each
  buffer counted once however many batches slice it, plus a fixed cost per
  batch and per entry (so that many tiny scans are bounded too).
- A scan is kept while it streams (a tee: the batches it sends, referenced
  again, never copied) and admitted when its stream ends. It is dropped as
  soon as it outgrows the cache or finds no room, when its client stops
  reading, or when it fails: a partial scan is never kept. Room is made by
  evicting the least recently used kept scans that no DoGet is sending (a
  scan being sent stays until its DoGet ends), and only when that makes
  enough room. A plain scan of fixed-width columns whose size, known from
  the version's row counts, exceeds the cache is not tried at all.
- One fill per key at a time; a second identical scan running meanwhile
  streams without keeping a copy.
- Key lookups (``WHERE key = v`` or ``IN (...)``, answered through an index)
  are never kept: they cost less to answer again than the room they would
  take from repeated scans.

Authorization is not the cache's: every DoGet has opened its ticket
(bound to its principal) and authorized and opened each pinned table before
the cache is looked at, so a hit skips no check. Lake grants whole
namespaces and has no row or column policy, so the rows of a key are the
same for every principal allowed to read the table, and one kept scan
serves all of them. Opening the pinned version first also keeps a
reclaimed version failing with VersionReclaimed, cached or not.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lake_core.config import QUERY_SCAN_CACHE_BYTES as SCAN_CACHE_BYTES
from lake_core.config import env_int
from lake_core.models import incarnation_of
from lake_core.telemetry import series
from lake_query.planning.direct import DirectScan

__all__ = [
    "DEFAULT_SCAN_CACHE_BYTES",
    "MAX_SCAN_CACHE_BYTES",
    "SCAN_CACHE_BYTES",
    "ScanCache",
    "ScanKey",
    "estimated_bytes",
    "retained_bytes",
    "scan_cache_bytes",
]

#: A quarter of the 4 GiB replica the defaults are sized for (docs/operations.md).
DEFAULT_SCAN_CACHE_BYTES = 1024**3
MAX_SCAN_CACHE_BYTES = 1024**4
#: What an entry costs beyond its Arrow buffers (Python objects, index slot), counted
#: so that many tiny scans (key lookups) cannot hold more than the bound says.
ENTRY_OVERHEAD_BYTES = 2048
BATCH_OVERHEAD_BYTES = 512


def scan_cache_bytes(env: Any = None) -> int:
    """``LAKE_QUERY_SCAN_CACHE_BYTES``, validated (ConfigError naming it)."""
    return env_int(SCAN_CACHE_BYTES, DEFAULT_SCAN_CACHE_BYTES, 0, MAX_SCAN_CACHE_BYTES, env)


@dataclass(frozen=True)
class ScanKey:
    """Everything that decides a direct scan's batches."""

    location: str
    incarnation: str
    lance_version: int
    columns: tuple[str, ...]
    row_filter: str | None
    #: The fragments of one partition, in order; None for the whole version.
    fragments: tuple[int, ...] | None
    batch_rows: int
    #: The result schema as sent (field metadata included), IPC-serialized.
    schema: bytes

    @property
    def nbytes(self) -> int:
        """About what the key itself holds."""
        return (
            len(self.location)
            + len(self.schema)
            + len(self.row_filter or "")
            + sum(len(c) + 64 for c in self.columns)
            + 32 * len(self.fragments or ())
        )

    @classmethod
    def of(cls, dataset: Any, plan: DirectScan, fragments: Any = None) -> ScanKey | None:
        """The key of ``plan`` on the opened ``dataset``; None: not to be kept (a key
        lookup, or a dataset without an incarnation)."""
        if not plan.cacheable:
            return None
        incarnation = incarnation_of(dataset.schema.metadata or {})
        if incarnation is None:
            return None  # not a table Metasrv stamped: nothing to tell recreations apart
        return cls(
            location=str(dataset.uri),
            incarnation=incarnation,
            lance_version=int(dataset.version),
            columns=tuple(plan.columns),
            row_filter=plan.row_filter,
            fragments=None if fragments is None else tuple(int(i) for i in fragments),
            batch_rows=plan.batch_rows,
            schema=plan.schema_ipc,
        )


def estimated_bytes(dataset: Any, plan: DirectScan, fragments: Any = None) -> int | None:
    """The size of an unfiltered scan of fixed-width columns, from row counts alone; else None.

    ``fragments``: the ids of one partition (None: the whole version).
    """
    if plan.row_filter is not None:
        return None
    width = 0
    for field in plan.schema:
        try:
            width += (int(field.type.bit_width) + 7) // 8
        except ValueError:  # variable width: unknown until scanned
            return None
    if fragments is None:
        found = list(dataset.get_fragments())
    else:
        found = [dataset.get_fragment(int(i)) for i in fragments]
        if any(fragment is None for fragment in found):
            return None  # refused by the scan itself
    return width * sum(int(fragment.metadata.num_rows) for fragment in found)


def retained_bytes(batch: pa.RecordBatch, seen: set[tuple[int, int]]) -> int:
    """Bytes of ``batch``'s buffers not in ``seen`` (which it extends).

    Slices of one batch share its buffers: counting each buffer once is what
    keeping them all actually holds.
    """
    total = 0
    for column in batch.columns:
        total += _array_bytes(column, seen)
    return total


def _array_bytes(array: pa.Array, seen: set[tuple[int, int]]) -> int:
    total = 0
    for buffer in array.buffers():  # children's buffers included
        if buffer is None:
            continue
        identity = (buffer.address, buffer.size)
        if identity not in seen:
            seen.add(identity)
            total += buffer.size
    if isinstance(array, pa.DictionaryArray):
        total += _array_bytes(array.dictionary, seen)
    return total


class _Entry:
    """One kept scan."""

    __slots__ = ("batches", "nbytes", "readers")

    def __init__(self, batches: list[pa.RecordBatch], nbytes: int) -> None:
        self.batches = batches
        self.nbytes = nbytes
        #: DoGets sending it now: it is not evicted until they end.
        self.readers = 0


class ScanCache:
    """A replica's kept scans, bounded by ``capacity_bytes`` (thread-safe)."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError("a scan cache needs a positive capacity (0 means no cache)")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[ScanKey, _Entry] = OrderedDict()
        self._filling: set[ScanKey] = set()
        #: Every byte the cache keeps alive (kept scans and scans being kept).
        self._held = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ScanCache({self.held_bytes}/{self.capacity_bytes} bytes, {len(self)} scans)"

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def replay(self, key: ScanKey) -> Iterator[pa.RecordBatch] | None:
        """The kept batches of ``key`` (a hit), or None (a miss); counts the lookup."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                entry.readers += 1
        if entry is None:
            series.SCAN_CACHE_LOOKUPS.inc(result="miss")
            return None
        series.SCAN_CACHE_LOOKUPS.inc(result="hit")
        return _Replay(self, entry)

    def keep(
        self, key: ScanKey, batches: Iterator[pa.RecordBatch], estimate: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """``batches`` unchanged, kept under ``key`` if they stream to their end and fit.

        ``estimate``: the scan's size known before it runs (None: unknown); a
        scan estimated larger than the cache is not kept (evicting nothing).
        """
        if estimate is not None and estimate > self.capacity_bytes:
            series.SCAN_CACHE_FILLS.inc(outcome="too_large")
            return batches
        with self._lock:
            if key in self._entries or key in self._filling:
                return batches  # kept already, or being kept by a scan running now
            self._filling.add(key)
        return _Fill(self, key, batches)

    # -- accounting (callers hold no lock) ---------------------------------

    def _reserve(self, fill: _Fill, nbytes: int) -> str | None:
        """Room for ``nbytes`` more of ``fill``: None if granted, else why not.

        Least recently used kept scans that nobody is reading are evicted for
        room, and only when that makes enough: a scan that cannot fit evicts nothing.
        """
        if fill.nbytes + nbytes > self.capacity_bytes:
            return "too_large"
        evicted = 0
        with self._lock:
            over = self._held + nbytes - self.capacity_bytes
            if over > 0:
                idle = [(k, e) for k, e in self._entries.items() if e.readers == 0]
                if sum(e.nbytes for _, e in idle) < over:
                    return "no_room"
                for key, entry in idle:  # least recently used first
                    if over <= 0:
                        break
                    del self._entries[key]
                    self._held -= entry.nbytes
                    over -= entry.nbytes
                    evicted += 1
            self._held += nbytes
            self._publish()
        if evicted:
            series.SCAN_CACHE_EVICTIONS.inc(evicted)
        return None

    def _drop(self, fill: _Fill, outcome: str) -> None:
        with self._lock:
            self._filling.discard(fill.key)
            self._held -= fill.nbytes
            self._publish()
        series.SCAN_CACHE_FILLS.inc(outcome=outcome)

    def _admit(self, fill: _Fill) -> None:
        with self._lock:
            self._filling.discard(fill.key)
            self._entries[fill.key] = _Entry(fill.batches, fill.nbytes)
            self._publish()
        series.SCAN_CACHE_FILLS.inc(outcome="admitted")

    def _done_reading(self, entry: _Entry) -> None:
        with self._lock:
            entry.readers -= 1

    def _publish(self) -> None:
        series.SCAN_CACHE_BYTES.set(self._held)
        series.SCAN_CACHE_ENTRIES.set(len(self._entries))


class _Replay:
    """A hit: the kept batches, handed out again (the entry is read, never changed)."""

    def __init__(self, cache: ScanCache, entry: _Entry) -> None:
        self._cache: ScanCache | None = cache
        self._entry = entry
        self._batches = iter(entry.batches)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        return next(self._batches)

    def close(self) -> None:
        cache, self._cache = self._cache, None
        if cache is not None:
            cache._done_reading(self._entry)

    def __del__(self) -> None:
        self.close()


class _Fill:
    """A miss being kept: the scan's batches pass through and are referenced again."""

    def __init__(self, cache: ScanCache, key: ScanKey, source: Iterator[pa.RecordBatch]) -> None:
        self.key = key
        self.batches: list[pa.RecordBatch] = []
        self.nbytes = 0
        self._cache: ScanCache | None = cache
        self._source = source
        self._seen: set[tuple[int, int]] = set()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        try:
            batch = next(self._source)
        except StopIteration:
            self._finish()
            raise
        except BaseException:
            self._stop("abandoned")
            raise
        if self._cache is not None:
            nbytes = retained_bytes(batch, self._seen) + BATCH_OVERHEAD_BYTES
            refused = self._cache._reserve(self, nbytes)
            if refused is None:
                self.batches.append(batch)
                self.nbytes += nbytes
            else:
                self._stop(refused)
        return batch

    def _finish(self) -> None:
        """The scan's last batch went: admit it, with what the entry itself costs."""
        cache = self._cache
        if cache is None:
            return
        refused = cache._reserve(self, ENTRY_OVERHEAD_BYTES + self.key.nbytes)
        if refused is not None:
            self._stop(refused)
            return
        self.nbytes += ENTRY_OVERHEAD_BYTES + self.key.nbytes
        self._cache = None
        cache._admit(self)

    def _stop(self, outcome: str) -> None:
        """Keep nothing more: release what was kept (the stream itself goes on)."""
        cache, self._cache = self._cache, None
        if cache is not None:
            cache._drop(self, outcome)
            self.batches = []
            self._seen = set()

    def close(self) -> None:
        """The stream ended before its last batch (client gone, failure): keep nothing."""
        self._stop("abandoned")
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __del__(self) -> None:
        self._stop("abandoned")
