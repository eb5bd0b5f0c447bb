"""The local data directory: where the registry, tables and sidecars live.

    <data-dir>/
      registry.sqlite3                 the registry (SQLite, WAL)
      tables/<ns>/<table>.lance        one Lance dataset per table
      sidecars/<incarnation>/<v>.json  reference deltas, one per Lake version
      metasrv.lock                     held by the one process writing here

Only one process may write a data directory at a time: the per-table commit
locks live in that process's memory, so a second writer (for example
``lake table create`` next to a running ``lake meta``) is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from lake_core.durable import fsync_dir
from lake_core.errors import Unavailable
from lake_core.names import TableRef

__all__ = ["DataDir", "fsync_dir"]

LOCK_FILE = "metasrv.lock"


class DataDir:
    """Paths inside one data directory, and its writer lock."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock_fd: int | None = None

    @property
    def registry_path(self) -> Path:
        return self.root / "registry.sqlite3"

    @property
    def tables_root(self) -> Path:
        return self.root / "tables"

    @property
    def sidecars_root(self) -> Path:
        return self.root / "sidecars"

    def table_path(self, table: TableRef) -> Path:
        # TableRef parts are validated identifiers: no separators, no dots.
        return self.tables_root / table.namespace / f"{table.name}.lance"

    def create(self) -> None:
        for path in (self.root, self.tables_root, self.sidecars_root):
            path.mkdir(parents=True, exist_ok=True)

    def lock(self) -> None:
        """Take the writer lock, or raise Unavailable if another process holds it."""
        self.create()
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Unavailable(
                f"data directory {self.root} is in use by another Lake process "
                "(a running `lake meta`?); stop it, or use `lake client` against it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> DataDir:
        self.lock()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unlock()
