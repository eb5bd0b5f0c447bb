"""Lance datasets: create, append, restore and retention, off the event loop.

The registry is the visibility boundary. The engine may hold a version the
registry never recorded (a crash between the Lance commit and the registry
commit); such an orphan must never become visible, not even through a later
append that Lance would happily stack on top of it. So every append first
checks that Lance's latest version is the registered one, and if it is not,
restores the registered version (a new Lance version with exactly its
content) before writing. Lake versions stay gap-free; Lance versions may skip.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import structlog

from lake_core.errors import Internal, InvalidSchema, VersionReclaimed
from lake_core.models import Engine, incarnation_metadata, incarnation_of
from lake_metasrv.datadir import fsync_dir

__all__ = ["LanceEngine"]

log = structlog.get_logger("lake_metasrv.engine")

#: Schema metadata key recording which table incarnation owns a dataset, so a
#: reader can tell a dropped-and-recreated table at the same path from the old one.
_DATASET_DIRS = ("data", "_versions", "_transactions", "_deletions")
_MTIME_SLACK_NS = 2_000_000_000


class LanceEngine:
    """Lance operations on local datasets; every public method is async."""

    name: Engine = "lance"

    def __init__(self, retain_versions: int) -> None:
        if not 1 <= retain_versions <= 10_000:
            raise ValueError("retain_versions must be in 1..=10000")
        self.retain_versions = retain_versions

    # -- create / drop ----------------------------------------------------

    async def create(self, location: str, schema: pa.Schema, incarnation: str) -> int:
        """Create an empty dataset owned by ``incarnation``; return its Lance version.

        The caller guarantees no registered table uses ``location``: anything
        already there is the leftover of a crashed create or drop and is removed.
        """
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
        _make_durable(path, started)
        fsync_dir(path.parent)
        return int(dataset.version)

    async def remove(self, location: str) -> None:
        """Delete a dropped table's dataset (best effort; the registry already forgot it)."""
        await asyncio.to_thread(shutil.rmtree, location, True)

    # -- append -----------------------------------------------------------

    async def append(
        self, location: str, incarnation: str, registered_version: int, data: pa.Table
    ) -> int:
        """Append ``data`` on top of the registered version; return the new Lance version."""
        return await asyncio.to_thread(
            self._append, location, incarnation, registered_version, data
        )

    def _append(
        self, location: str, incarnation: str, registered_version: int, data: pa.Table
    ) -> int:
        started = time.time_ns()
        self._restore_registered(location, incarnation, registered_version)
        dataset = lance.write_dataset(data, location, mode="append")
        _make_durable(Path(location), started)
        return int(dataset.version)

    def _restore_registered(self, location: str, incarnation: str, registered: int) -> None:
        latest = lance.dataset(location)
        owner = incarnation_of(latest.schema.metadata)
        if owner != incarnation:
            raise Internal(
                f"dataset {location} belongs to incarnation {owner or '?'}, "
                f"the registry says {incarnation}"
            )
        if latest.latest_version == registered:
            return
        if latest.latest_version < registered:
            raise Internal(
                f"dataset {location} is at Lance version {latest.latest_version}, "
                f"behind the registered {registered}: versions were lost"
            )
        # An orphan: written by Lance, never registered. Make the registered
        # version the latest again so the next append does not inherit it.
        log.warning(
            "restoring registered version over unregistered Lance versions",
            location=location,
            registered=registered,
            latest=latest.latest_version,
        )
        try:
            lance.dataset(location, version=registered).restore()  # type: ignore[no-untyped-call]
        except ValueError as exc:
            raise Internal(f"cannot restore {location} to version {registered}: {exc}") from None

    # -- reads and retention ----------------------------------------------

    async def latest_version(self, location: str) -> int:
        return await asyncio.to_thread(lambda: int(lance.dataset(location).latest_version))

    async def read(self, location: str, engine_version: int) -> pa.Table:
        """The rows of one exact version (for tools and tests; Query reads directly)."""
        return await asyncio.to_thread(_read_version, location, engine_version)

    async def cleanup(self, location: str, registered_version: int) -> int:
        """Keep the newest ``retain_versions`` Lance versions plus tagged ones.

        Runs only when the registered version is the latest, so it can never
        reclaim the version readers are told to use. Returns versions removed.
        """
        return await asyncio.to_thread(self._cleanup, location, registered_version)

    def _cleanup(self, location: str, registered_version: int) -> int:
        removed = reclaim_old_versions(
            lance.dataset(location), location, registered_version, self.retain_versions
        )
        return removed or 0


def _read_version(location: str, engine_version: int) -> pa.Table:
    try:
        dataset = lance.dataset(location, version=engine_version)
    except ValueError as exc:
        if "not found" in str(exc):
            raise VersionReclaimed(
                f"version {engine_version} of {location} has been reclaimed"
            ) from None
        raise
    return dataset.to_table()


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_durable(dataset: Path, since_ns: int) -> None:
    """fsync the files a Lance commit wrote, and their directories.

    Lance's local store does not fsync; the registry does (synchronous=FULL),
    so without this a power loss could leave the registry pointing at a
    manifest that never reached the disk.
    """
    # File systems stamp mtimes from a coarse clock; look a little further back.
    since_ns -= _MTIME_SLACK_NS
    directories: Iterable[Path] = [dataset / name for name in _DATASET_DIRS]
    for directory in directories:
        if not directory.is_dir():
            continue
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime_ns >= since_ns:
                _fsync_file(entry.path)
        fsync_dir(directory)
    fsync_dir(dataset)


def reclaim_old_versions(
    dataset: Any, location: str, registered_version: int, retain_versions: int
) -> int | None:
    """Apply retention to ``dataset``; None when skipped because Lance is ahead of the registry.

    Tagged versions are kept whatever their age.
    """
    if dataset.latest_version != registered_version:
        log.warning(
            "skipping retention: latest Lance version is not the registered one",
            location=location,
            registered=registered_version,
            latest=dataset.latest_version,
        )
        return None
    stats = dataset.cleanup_old_versions(
        retain_versions=retain_versions, error_if_tagged_old_versions=False
    )
    return int(stats.old_versions)
