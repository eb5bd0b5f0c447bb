"""Digest records of local tables, under ``<data-dir>/integrity`` (fsync'd before a commit)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from lake_core.durable import fsync_dir, replace_synced
from lake_core.integrity import DataFileReader
from lake_metasrv.digests.base import DigestStore
from lake_metasrv.engine.base import LanceEngine

__all__ = ["LocalDigestStore"]


class LocalDigestStore(DigestStore):
    """Digest records under ``<data-dir>/integrity``."""

    def __init__(self, root: Path, engine: LanceEngine, files: DataFileReader | None = None):
        super().__init__(engine, files or DataFileReader())
        self.root = root

    @classmethod
    def of(cls, data_dir: Path, engine: LanceEngine) -> LocalDigestStore:
        """The store of a Metasrv data directory."""
        return cls(data_dir / "integrity", engine)

    def name(self, version: int, engine_version: int | None = None) -> str:
        # Local records predate zero-padding; both sort by glob below.
        rewrite = "" if engine_version is None else f"-e{engine_version}"
        return f"{version}{rewrite}.json"

    def path(self, incarnation: str, version: int) -> Path:
        return self.root / incarnation / self.name(version)

    def _put(self, incarnation: str, records: Sequence[tuple[str, bytes]]) -> None:
        directory = self.root / incarnation
        fresh = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        if fresh:
            fsync_dir(self.root)
        for name, body in records:
            replace_synced(directory / name, [body], mode=0o644, sync_dir=False)
        fsync_dir(directory)

    def _listing(self, incarnation: str) -> dict[str, str]:
        directory = self.root / incarnation
        if not directory.is_dir():
            return {}
        listing = {}
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(".json"):
                    info = entry.stat()
                    listing[entry.name] = f"{info.st_mtime_ns}:{info.st_size}:{info.st_ino}"
        return listing

    def _read(self, incarnation: str, names: Sequence[str]) -> list[bytes]:
        directory = self.root / incarnation
        return [(directory / name).read_bytes() for name in names]
