"""Rechecking a table's data files against the digests recorded when they were committed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from lake_core.errors import DataCorrupted, Unavailable, VersionReclaimed
from lake_core.integrity import (
    DataFileDigest,
    DataFileProblem,
    DataFileReader,
    VerifyTableResult,
    fragment_file_paths,
)
from lake_core.names import TableRef
from lake_core.telemetry import series
from lake_metasrv.digests.base import DigestStore
from lake_metasrv.engine.base import LanceEngine

__all__ = ["verify_table"]

log = structlog.get_logger("lake_metasrv.integrity")


def _check_files(
    files: DataFileReader,
    table: TableRef,
    location: str,
    recorded: dict[str, DataFileDigest],
    readers: dict[str, list[int]],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[DataFileProblem], list[str]]:
    problems: list[DataFileProblem] = []
    unrecorded: list[str] = []
    for done, (path, versions) in enumerate(sorted(readers.items())):
        if progress is not None:
            progress(done, len(readers))
        expected = recorded.get(path)
        try:
            size, sha = files.digest(location, path)
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
            if files.is_remote(location):
                # The store did not answer: not a verdict on the file.
                raise Unavailable(
                    f"{table}: table storage is unreachable; verify again later"
                ) from None
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
    engine: LanceEngine, table: TableRef, location: str, versions: Sequence[tuple[int, int]]
) -> tuple[dict[str, list[int]], list[int]]:
    """Which table versions read each data file; the versions still open-able."""
    readers: dict[str, list[int]] = {}
    checked: list[int] = []
    for version, engine_version in versions:
        try:
            dataset = engine.open_version(location, engine_version)
        except (ValueError, OSError) as exc:
            failure = engine.read_failure(location, engine_version, exc)
            if isinstance(failure, VersionReclaimed):
                continue  # reclaimed by retention: not a retained version
            if isinstance(failure, Unavailable):
                raise failure from None
            raise DataCorrupted(
                f"{table} version {version}: its stored manifest cannot be read"
            ) from None
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
    if all_versions:
        history = await coordinator.registry.versions(record.incarnation)
        versions = [(v.version, v.engine_version) for v in history]
    else:
        versions = [(record.version, record.engine_version)]
    location = record.location

    def run() -> VerifyTableResult:
        readers, checked = _readers(store.engine, table, location, versions)
        recorded = store.recorded(record.incarnation)
        problems, unrecorded = _check_files(
            store.files, table, location, recorded, readers, progress
        )
        if progress is not None:
            progress(len(readers), len(readers))
        return VerifyTableResult(
            table=table,
            versions=checked,
            files_checked=len(readers),
            unrecorded=unrecorded,
            problems=problems,
        )

    try:
        result = await asyncio.to_thread(run)
    except BaseException:
        series.VERIFY_RUNS.inc(outcome="failed")
        raise
    series.VERIFY_RUNS.inc(outcome="mismatch" if result.problems else "ok")
    if result.problems:
        log.error(
            "data files differ from their commit", table=str(table), count=len(result.problems)
        )
    return result
