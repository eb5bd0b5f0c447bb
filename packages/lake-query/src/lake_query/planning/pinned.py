"""Opened Lance datasets, kept across requests for the exact versions they pin.

Opening a dataset reads its manifest and, on the first indexed lookup, loads
its scalar indexes: a few milliseconds that a key lookup should not pay on
every request (and that planning and execution would each pay). A pinned
version never changes, so one opened handle serves every request for the
same (location, incarnation, Lance version).

Reuse must not outlive the version: retention may reclaim it while its data
files live on under newer versions, and a reclaimed version has to fail
with VersionReclaimed, never be served from a stale handle; and a table
dropped and recreated at the same path restarts Lance's version numbers. So
a hit is only used while the very manifest file it was opened from is still
there: same inode, size and mtime (one ``stat``). Object-store datasets are
not cached: that check would be a request.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["PinnedDatasets"]

#: Lance's manifest file names: V2 (reverse-ordered) and the V1 scheme.
_U64_MAX = 2**64 - 1


def _manifest_identity(location: str, version: int) -> tuple[int, int, int, int] | None:
    """Which file holds ``version``'s manifest now (None if it is gone)."""
    versions = os.path.join(location, "_versions")
    for name in (f"{_U64_MAX - version:020d}.manifest", f"{version}.manifest"):
        try:
            st = os.stat(os.path.join(versions, name))
        except FileNotFoundError:
            continue
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return None


class PinnedDatasets:
    """A bounded, thread-safe LRU of datasets opened at exact versions."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str, int], tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, location: str, incarnation: str, version: int, opener: Callable[[], Any]) -> Any:
        """The cached dataset while its manifest is unchanged on disk, else ``opener()``."""
        if "://" in location:
            return opener()
        key = (location, incarnation, version)
        with self._lock:
            cached = self._entries.get(key)
        identity = _manifest_identity(location, version)
        if cached is not None:
            dataset, opened_from = cached
            if identity is not None and identity == opened_from:
                with self._lock:
                    if key in self._entries:
                        self._entries.move_to_end(key)
                return dataset
            self.forget(key)
        dataset = opener()
        if identity is None or identity != _manifest_identity(location, version):
            return dataset  # changing under us: do not keep it
        with self._lock:
            self._entries[key] = (dataset, identity)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return dataset

    def forget(self, key: tuple[str, str, int]) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
