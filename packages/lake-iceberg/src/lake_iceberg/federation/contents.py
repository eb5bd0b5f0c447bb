"""Manifests and manifest lists, kept per replica: Iceberg never rewrites a file in place.

Every direct read of a snapshot reads its manifest list and then every
manifest it names (lake_iceberg.federation.scan). A manifest is immutable
once committed (a new commit writes new files under new names), and the
manifest list records each manifest's length, so bytes read once under
that path and length are the bytes any later read would get. On the
``iceberg_scan`` bench table (40 one-file manifests) fetching them again
cost the replica ~0.05 s of CPU per scan and the object store ~0.07 s, more
than a tenth of the whole stack's work (docs/performance-analysis.md).

A snapshot's manifest list is as immutable (one per snapshot, named for
it): :class:`ManifestLists` keeps the manifests it lists, by its path,
which also saves its request (~2-3 ms of CPU and a round trip before the
first data file).

What stays fresh on every DoGet: the table metadata (the catalog load
that proves the ticket's snapshot is still retained, else
VersionReclaimed) and every data file. A manifest or manifest list deleted
from storage after it was read here is no longer noticed by later scans of
a retained snapshot: the rows are still served from the data files, which
are read (and checked) each time.

Bounded: at most :data:`CONTENT_BYTES` in all, none larger than
:data:`MAX_FILE_BYTES` (larger manifests are read each time), least
recently used first out. Entries are keyed by path and the length the
manifest list records; a read of another length is not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from pyiceberg.manifest import ManifestFile

__all__ = ["CONTENT_BYTES", "LISTED_MANIFESTS", "MAX_FILE_BYTES", "ManifestBytes", "ManifestLists"]

#: Most manifest bytes a replica keeps.
CONTENT_BYTES = 64 * 1024 * 1024
#: Largest manifest kept (a manifest of tens of thousands of files is read each time).
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Most manifest entries (of all kept manifest lists together) a replica keeps.
LISTED_MANIFESTS = 100_000


class ManifestBytes:
    """A bounded LRU of manifest contents by (path, recorded length); thread-safe."""

    def __init__(self, capacity: int = CONTENT_BYTES, max_file: int = MAX_FILE_BYTES) -> None:
        self.capacity = capacity
        self.max_file = max_file
        self._items: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def get(self, path: str, length: int) -> bytes | None:
        with self._lock:
            found = self._items.get((path, length))
            if found is not None:
                self._items.move_to_end((path, length))
            return found

    def put(self, path: str, length: int, data: bytes) -> None:
        """Keep ``data`` read from ``path`` if it is the recorded ``length`` and fits."""
        if len(data) != length or length > min(self.max_file, self.capacity):
            return
        key = (path, length)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return
            self._items[key] = data
            self._bytes += length
            while self._bytes > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted)


class ManifestLists:
    """A bounded LRU of the manifests each manifest list names, by its path; thread-safe.

    Bounded by the manifests listed in all (:data:`LISTED_MANIFESTS`); a list
    longer than that is not kept. pyiceberg shares its ManifestFile objects
    between snapshots too (its own manifest cache): they are never changed.
    """

    def __init__(self, capacity: int = LISTED_MANIFESTS) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[ManifestFile, ...]] = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, path: str) -> tuple[ManifestFile, ...] | None:
        with self._lock:
            found = self._items.get(path)
            if found is not None:
                self._items.move_to_end(path)
            return found

    def put(self, path: str, manifests: Sequence[ManifestFile]) -> None:
        if len(manifests) > self.capacity:
            return
        with self._lock:
            if path in self._items:
                self._items.move_to_end(path)
                return
            self._items[path] = tuple(manifests)
            self._count += len(manifests)
            while self._count > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self._count -= len(evicted)
