"""Size and SHA-256 of every data file a commit writes, and rechecking them.

At commit time, beside each version's reference-delta sidecar, Metasrv writes
the digests of the data files that version added (written and fsync'd before
the registry moves, like the sidecar):

    <data-dir>/integrity/<incarnation>/<version>.json

Data files are immutable and Lance names each one uniquely, so the union of
an incarnation's records names every file any of its versions reads.
:func:`verify_table` recomputes them for the current version (or every
retained version) and reports each file that differs or is gone.

Only local datasets are covered: for ``s3://`` tables nothing is recorded
(object storage checks its own bytes in transit; see docs/integrity.md).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import lance
import structlog
from pydantic import BaseModel, ConfigDict

from lake_core.durable import fsync_dir, replace_synced
from lake_core.errors import FailedPrecondition
from lake_core.integrity import (
    DataFileDigest,
    DataFileProblem,
    VerifyTableResult,
    digest_file,
    fragment_file_paths,
)
from lake_core.names import TableRef

__all__ = ["DigestStore", "VersionDigests", "verify_table"]

log = structlog.get_logger("lake_metasrv.integrity")


class VersionDigests(BaseModel):
    """The data files one table version added, as written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    table: TableRef
    incarnation: str
    version: int
    files: list[DataFileDigest]


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _data_dir(location: str) -> Path:
    return Path(location.removeprefix("file://")) / "data"


class DigestStore:
    """Digest records under ``<data-dir>/integrity``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, data_dir: Path) -> DigestStore:
        """The store of a Metasrv data directory."""
        return cls(data_dir / "integrity")

    def path(self, incarnation: str, version: int) -> Path:
        return self.root / incarnation / f"{version}.json"

    def record(
        self,
        table: TableRef,
        incarnation: str,
        location: str,
        versions: Sequence[tuple[int, Iterable[Any]]],
    ) -> None:
        """Hash the fragments each ``(version, fragments)`` added; write one record each.

        Blocking (runs on a worker thread). Remote datasets are skipped.
        """
        if not _is_local(location) or not versions:
            return
        data = _data_dir(location)
        directory = self.root / incarnation
        fresh = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        if fresh:
            fsync_dir(self.root)
        for version, fragments in versions:
            files = []
            for path in fragment_file_paths(fragments):
                size, sha = digest_file(data / path)
                files.append(DataFileDigest(path=path, size_bytes=size, sha256=sha))
            record = VersionDigests(
                table=table, incarnation=incarnation, version=version, files=files
            )
            body = json.dumps(record.model_dump(mode="json"), sort_keys=True).encode()
            replace_synced(self.path(incarnation, version), [body], mode=0o644, sync_dir=False)
        fsync_dir(directory)

    def record_rewrite(
        self, table: TableRef, incarnation: str, location: str, version: int, engine_version: int
    ) -> None:
        """Record the data files a maintenance rewrite (compaction) added to ``engine_version``.

        Blocking. Written before the registry points readers at the rewrite;
        files already recorded are not hashed again.
        """
        if not _is_local(location):
            return
        known = self.recorded(incarnation)
        dataset = lance.dataset(location, version=engine_version)
        added = [p for p in fragment_file_paths(dataset.get_fragments()) if p not in known]
        if not added:
            return
        data = _data_dir(location)
        files = []
        for path in added:
            size, sha = digest_file(data / path)
            files.append(DataFileDigest(path=path, size_bytes=size, sha256=sha))
        record = VersionDigests(table=table, incarnation=incarnation, version=version, files=files)
        body = json.dumps(record.model_dump(mode="json"), sort_keys=True).encode()
        target = self.root / incarnation / f"{version}-e{engine_version}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_synced(target, [body], mode=0o644)

    def recorded(self, incarnation: str) -> dict[str, DataFileDigest]:
        """Every recorded data file of ``incarnation``, by path."""
        found: dict[str, DataFileDigest] = {}
        directory = self.root / incarnation
        if not directory.is_dir():
            return found
        for entry in sorted(directory.glob("*.json")):
            record = VersionDigests.model_validate_json(entry.read_bytes())
            for digest in record.files:
                found[digest.path] = digest
        return found


def _check_files(
    location: str,
    recorded: dict[str, DataFileDigest],
    readers: dict[str, list[int]],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[DataFileProblem], list[str]]:
    data = _data_dir(location)
    problems: list[DataFileProblem] = []
    unrecorded: list[str] = []
    for done, (path, versions) in enumerate(sorted(readers.items())):
        if progress is not None:
            progress(done, len(readers))
        expected = recorded.get(path)
        try:
            size, sha = digest_file(data / path)
        except FileNotFoundError:
            problems.append(
                DataFileProblem(
                    path=path,
                    versions=versions,
                    problem="missing",
                    expected_size_bytes=expected.size_bytes if expected else None,
                    expected_sha256=expected.sha256 if expected else None,
                )
            )
            continue
        except OSError:
            problems.append(DataFileProblem(path=path, versions=versions, problem="unreadable"))
            continue
        if expected is None:
            unrecorded.append(path)
        elif size != expected.size_bytes or sha != expected.sha256:
            problems.append(
                DataFileProblem(
                    path=path,
                    versions=versions,
                    problem="size" if size != expected.size_bytes else "sha256",
                    expected_size_bytes=expected.size_bytes,
                    actual_size_bytes=size,
                    expected_sha256=expected.sha256,
                    actual_sha256=sha,
                )
            )
    return problems, unrecorded


def _readers(
    location: str, versions: Sequence[tuple[int, int]]
) -> tuple[dict[str, list[int]], list[int]]:
    """Which table versions read each data file; the versions still open-able."""
    readers: dict[str, list[int]] = {}
    checked: list[int] = []
    for version, engine_version in versions:
        try:
            dataset = lance.dataset(location, version=engine_version)
        except (ValueError, OSError):
            continue  # reclaimed by retention: not a retained version
        checked.append(version)
        for path in fragment_file_paths(dataset.get_fragments()):
            readers.setdefault(path, []).append(version)
    return readers, checked


async def verify_table(
    coordinator: Any,
    store: DigestStore,
    table: TableRef,
    *,
    all_versions: bool,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyTableResult:
    """Recompute every data file of ``table``'s current (or every retained) version.

    ``progress(done, total)`` is called (from a worker thread) before each file.
    """
    record = await coordinator.describe_table(table)
    if not _is_local(record.location):
        raise FailedPrecondition(
            f"{table}: lake table verify covers tables in a local data directory only"
        )
    if all_versions:
        history = await coordinator.registry.versions(record.incarnation)
        versions = [(v.version, v.engine_version) for v in history]
    else:
        versions = [(record.version, record.engine_version)]
    location = record.location

    def run() -> VerifyTableResult:
        readers, checked = _readers(location, versions)
        recorded = store.recorded(record.incarnation)
        problems, unrecorded = _check_files(location, recorded, readers, progress)
        if progress is not None:
            progress(len(readers), len(readers))
        return VerifyTableResult(
            table=table,
            versions=checked,
            files_checked=len(readers),
            unrecorded=unrecorded,
            problems=problems,
        )

    result = await asyncio.to_thread(run)
    if result.problems:
        log.error(
            "data files differ from their commit", table=str(table), count=len(result.problems)
        )
    return result
