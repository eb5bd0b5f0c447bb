"""The table engine on a local data directory: Lance datasets Lake fsyncs itself.

``<data-dir>/tables/<ns>/<table>.lance``; every file a commit wrote is
fsync'd (:class:`LocalWrittenFiles`) before the registry may point at it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import structlog

from lake_core.durable import fsync_dir, fsync_together, fsync_written_since
from lake_core.errors import InvalidSchema
from lake_core.models import incarnation_metadata
from lake_core.names import TableRef
from lake_metasrv.config import DEFAULT_RETAIN_MIN_AGE_SECS
from lake_metasrv.engine.base import LanceEngine, WrittenFiles, reclaim_old_versions

__all__ = ["LocalLanceEngine", "LocalWrittenFiles"]

log = structlog.get_logger("lake_metasrv.engine")

#: The directories of a new dataset that its create fsyncs (Lance does not).
_DATASET_DIRS = ("data", "_versions", "_transactions", "_deletions")


class LocalLanceEngine(LanceEngine):
    """Lance datasets under a local directory, fsync'd by Lake before they are registered."""

    def __init__(
        self,
        retain_versions: int,
        tables_root: Path,
        *,
        retain_min_age_secs: int = DEFAULT_RETAIN_MIN_AGE_SECS,
        cleanup_every: int | None = None,
        fence: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            retain_versions,
            retain_min_age_secs=retain_min_age_secs,
            cleanup_every=cleanup_every,
            fence=fence,
            clock=clock,
        )
        self.tables_root = tables_root

    def location(self, table: TableRef) -> str:
        # TableRef parts are validated identifiers: no separators, no dots.
        return str(self.tables_root / table.namespace / f"{table.name}.lance")

    def uri(self, location: str) -> str:
        return location

    def storage_options(self, location: str) -> dict[str, str] | None:
        return None

    def local_path(self, location: str) -> Path | None:
        return Path(location)

    def storage_error(self, location: str, exc: BaseException) -> BaseException:
        return exc

    def written_files(self, location: str) -> WrittenFiles:
        return LocalWrittenFiles(Path(location))

    # -- create / drop ----------------------------------------------------

    async def create(self, location: str, schema: pa.Schema, incarnation: str) -> int:
        return await asyncio.to_thread(self._create, location, schema, incarnation)

    def _create(self, location: str, schema: pa.Schema, incarnation: str) -> int:
        path = Path(location)
        if path.exists():
            log.warning("removing unregistered dataset left by a crash", location=location)
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        owned = schema.with_metadata(incarnation_metadata(incarnation))
        started = time.time_ns()
        try:
            dataset = lance.write_dataset(
                owned.empty_table(), location, schema=owned, mode="create"
            )
        except (ValueError, NotImplementedError, pa.ArrowException) as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise InvalidSchema(f"Lance cannot store this schema: {exc}") from None
        # Lance does not fsync; the registry (synchronous=FULL) must never
        # point at a manifest still in the page cache.
        fsync_written_since(path, started, only=_DATASET_DIRS)
        fsync_dir(path.parent)
        self._datasets[location] = (incarnation, dataset)
        return int(dataset.version)

    async def remove(self, location: str) -> None:
        self._datasets.pop(location, None)
        self._since_cleanup.pop(location, None)
        await asyncio.to_thread(shutil.rmtree, location, True)

    async def read(self, location: str, engine_version: int) -> pa.Table:
        def read() -> pa.Table:
            try:
                dataset = lance.dataset(location, version=engine_version)
            except (ValueError, OSError) as exc:
                raise self.read_failure(location, engine_version, exc) from None
            return dataset.to_table()

        return await asyncio.to_thread(read)

    def cleanup_now(self, location: str, registered_version: int) -> int:
        dataset = lance.dataset(location)
        removed = reclaim_old_versions(
            dataset,
            location,
            registered_version,
            self.retain_versions,
            min_age_secs=self.retain_min_age_secs,
            now=self.clock(),
        )
        return removed or 0


class LocalWrittenFiles(WrittenFiles):
    """What local Lance writes must fsync before the registry may point at them.

    Lance's local store does not fsync; the registry does (synchronous=FULL),
    so without this a power loss could leave the registry pointing at a
    manifest or data file that never reached the disk. Data files are known
    from their fragments; manifests and transaction files are the names that
    appeared since the tracker was made (those directories stay small:
    retention prunes them).
    """

    _LISTED = ("_versions", "_transactions")

    def __init__(self, dataset: Path) -> None:
        self.dataset = dataset
        self._before: dict[str, set[str]] = {}
        self._had_data_dir = True

    def before_commits(self) -> None:
        """Note what exists now, so :meth:`sync_commits` can tell what is new."""
        self._before = {name: _names(self.dataset / name) for name in self._LISTED}
        self._had_data_dir = (self.dataset / "data").is_dir()

    def sync_data(self, fragments: Iterable[Any]) -> None:
        """The data files themselves (their directory entries: :meth:`sync_commits`)."""
        fsync_together(self._data_files(fragments))

    def _data_files(self, fragments: Iterable[Any]) -> list[Path]:
        return [
            self.dataset / "data" / data_file.path
            for fragment in fragments
            for data_file in fragment.files
        ]

    def sync_commits(self, fragments: Iterable[Any] = ()) -> None:
        """New manifests and transactions, every directory entry, and the data files
        of ``fragments`` (written without :meth:`sync_data`), once per group.

        All fsync'd at once (:func:`fsync_together`): only the set must be
        durable before the registry moves, not any order within it.
        """
        files = [
            self.dataset / name / entry
            for name in self._LISTED
            for entry in _names(self.dataset / name) - self._before.get(name, set())
        ]
        files += self._data_files(fragments)
        dirs = [self.dataset / name for name in ("data", *self._LISTED)]
        dirs = [directory for directory in dirs if directory.is_dir()]
        if not self._had_data_dir:  # the first append created data/
            dirs.append(self.dataset)
        fsync_together(files, dirs)


def _names(directory: Path) -> set[str]:
    try:
        return set(os.listdir(directory))
    except FileNotFoundError:
        return set()
