"""Reference-delta sidecars as files in the data directory (local mode).

``<data-dir>/sidecars/<incarnation>/<version>.json``, each fsync'd with its
directory before the registry may point at its version.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from lake_core.durable import fsync_dir, replace_synced
from lake_core.references import DROPPED_NAME, DropMarker, ReferenceDelta, local_sidecar_name
from lake_metasrv.sidecars.base import SidecarStore

__all__ = ["LocalSidecarStore"]


class LocalSidecarStore(SidecarStore):
    """Sidecar files under ``<data-dir>/sidecars``, each fsync'd with its directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, incarnation: str, version: int, engine_version: int | None = None) -> Path:
        return self.root / incarnation / local_sidecar_name(version, engine_version)

    def write_delta(self, delta: ReferenceDelta) -> str:
        target = self.path(delta.incarnation, delta.version, delta.engine_version)
        return str(self._write(target, delta))

    def write_deltas(self, deltas: Sequence[ReferenceDelta]) -> None:
        """Write several deltas, each fsync'd, with one fsync per directory at the end."""
        directories: set[Path] = set()
        for delta in deltas:
            target = self.path(delta.incarnation, delta.version, delta.engine_version)
            self._write(target, delta, sync_dir=False)
            directories.add(target.parent)
        for directory in directories:
            fsync_dir(directory)

    def write_drop(self, marker: DropMarker) -> str:
        return str(self._write(self.root / marker.incarnation / DROPPED_NAME, marker))

    def read_delta(
        self, incarnation: str, version: int, operation_id: str | None = None
    ) -> ReferenceDelta:
        # One sidecar per version locally: a retry of the version replaces it.
        return ReferenceDelta.model_validate_json(self.path(incarnation, version).read_bytes())

    def _write(self, target: Path, model: BaseModel, *, sync_dir: bool = True) -> Path:
        directory = target.parent
        fresh_dir = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        if fresh_dir:
            fsync_dir(directory.parent)
        data = json.dumps(model.model_dump(mode="json"), sort_keys=True).encode()
        replace_synced(target, [data], mode=0o644, sync_dir=sync_dir)
        return target
