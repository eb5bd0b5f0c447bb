"""Typed questions to a table's store, asked after Lance fails.

Lance reports every failure as a ``ValueError`` whose only distinction is
its text, so no Lake process reads that text. After Lance fails, a
:class:`StorageProbe` asks the store itself through pyarrow's file
systems, which answer in types: a file is there or ``FileType.NotFound``,
and an unreachable store raises ``OSError``. Query and Metasrv both map
those answers to Lake errors (Unavailable, VersionReclaimed, ...).

The probe runs only on failure paths; a healthy request never pays for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow.fs as pafs

from lake_core.cloud import DatasetStorage
from lake_core.store_fs import StoreFileSystems

__all__ = ["MAX_PROBED_FILES", "StorageProbe"]

_U64_MAX = 2**64 - 1
#: Data files checked after a failed scan; more are not worth the requests.
MAX_PROBED_FILES = 256


class StorageProbe:
    """Typed questions to a table's store (blocking; only after a failure).

    Every method raises ``OSError`` when the store cannot be reached (or
    refuses access): the caller maps it, usually to Unavailable.
    """

    def __init__(self, storage: DatasetStorage) -> None:
        self._stores = StoreFileSystems(storage)

    def _where(self, location: str) -> tuple[pafs.FileSystem, str]:
        return self._stores.where(location)

    def _exists(self, fs: pafs.FileSystem, paths: Iterable[str]) -> list[bool]:
        return [info.type != pafs.FileType.NotFound for info in fs.get_file_info(list(paths))]

    def reachable(self, location: str) -> bool:
        """Whether the store holding ``location`` answers at all (whatever it holds)."""
        fs, root = self._where(location)
        try:
            self._exists(fs, [root])
        except OSError:
            return False
        return True

    def version_exists(self, location: str, engine_version: int) -> bool:
        """Whether the manifest of ``engine_version`` is still stored."""
        fs, root = self._where(location)
        names = (f"{_U64_MAX - engine_version:020d}.manifest", f"{engine_version}.manifest")
        return any(self._exists(fs, (f"{root}/_versions/{name}" for name in names)))

    def data_files_exist(self, location: str, dataset: Any) -> bool:
        """Whether every data file (up to :data:`MAX_PROBED_FILES`) of ``dataset`` is stored."""
        fs, root = self._where(location)
        paths = [
            f"{root}/data/{data_file.path}"
            for fragment in dataset.get_fragments()
            for data_file in fragment.data_files()
        ][:MAX_PROBED_FILES]
        return all(self._exists(fs, paths)) if paths else True
