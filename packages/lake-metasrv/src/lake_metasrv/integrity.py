"""Size and SHA-256 of every data file a commit writes, and rechecking them.

At commit time, beside each version's reference-delta sidecar, Metasrv
writes the digests of the data files that version added (durable before the
registry moves, like the sidecar). Local tables keep them in the data
directory, S3 tables beside their sidecars in the bucket:

    <data-dir>/integrity/<incarnation>/<version>.json
    s3://<bucket>/<table prefix>/_lake-integrity/<incarnation>/<version:020d>.json

A compaction adds ``<version>-e<engine version>.json`` for the files it
rewrote. Data files are immutable and Lance names each one uniquely, so the
union of an incarnation's records names every file any of its versions
reads. :func:`verify_table` recomputes them for the current version (or
every retained version) and reports each file that differs or is gone.

On S3 the data files are read back after Lance wrote them (one GET each,
concurrent with the Lance commit): Lance writes them itself and exposes no
digest of what it sent.
"""

from __future__ import annotations

import abc
import asyncio
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict

from lake_core.durable import fsync_dir, replace_synced
from lake_core.errors import DataCorrupted, Internal, Unavailable, VersionReclaimed
from lake_core.integrity import (
    DataFileDigest,
    DataFileProblem,
    DataFileReader,
    VerifyTableResult,
    fragment_file_paths,
)
from lake_core.names import TableRef
from lake_core.telemetry import series
from lake_metasrv.engine import LanceEngine

__all__ = [
    "DigestStore",
    "LocalDigestStore",
    "VersionDigests",
    "verify_table",
]

log = structlog.get_logger("lake_metasrv.integrity")


class VersionDigests(BaseModel):
    """The data files one table version added, as written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    table: TableRef
    incarnation: str
    version: int
    files: list[DataFileDigest]


def _body(record: VersionDigests) -> bytes:
    return json.dumps(record.model_dump(mode="json"), sort_keys=True).encode()


class DigestStore(abc.ABC):
    """Where digest records live; hashing goes through the engine's stores.

    Every method blocks (callers run them on a worker thread).
    """

    def __init__(self, engine: LanceEngine, files: DataFileReader) -> None:
        self.engine = engine
        self.files = files
        self._known = _KnownDigests()

    # -- what an implementation stores -------------------------------------------------

    @abc.abstractmethod
    def _put(self, incarnation: str, records: Sequence[tuple[str, bytes]]) -> None:
        """Durably store ``(name, body)`` records of ``incarnation`` (names end ``.json``)."""

    @abc.abstractmethod
    def _listing(self, incarnation: str) -> dict[str, str]:
        """Every stored record name of ``incarnation`` with a stamp that changes on rewrite."""

    @abc.abstractmethod
    def _read(self, incarnation: str, names: Sequence[str]) -> list[bytes]:
        """The bodies of ``names`` (in that order)."""

    def _bodies(self, incarnation: str) -> list[bytes]:
        """Every stored record of ``incarnation``, oldest name first."""
        return self._read(incarnation, sorted(self._listing(incarnation)))

    # -- recording and reading ---------------------------------------------------------

    def _digests(self, location: str, paths: Iterable[str]) -> list[DataFileDigest]:
        files = []
        for path in paths:
            try:
                size, sha = self.files.digest(location, path)
            except FileNotFoundError:
                raise Internal("a data file Lance just wrote is not stored") from None
            except OSError:
                if not self.files.is_remote(location):
                    raise
                raise Unavailable("table storage is unreachable; retry") from None
            files.append(DataFileDigest(path=path, size_bytes=size, sha256=sha))
        return files

    def record(
        self,
        table: TableRef,
        incarnation: str,
        location: str,
        versions: Sequence[tuple[int, Iterable[Any]]],
    ) -> None:
        """Hash the fragments each ``(version, fragments)`` added; store one record each."""
        if not versions:
            return
        records = []
        for version, fragments in versions:
            record = VersionDigests(
                table=table,
                incarnation=incarnation,
                version=version,
                files=self._digests(location, fragment_file_paths(fragments)),
            )
            records.append((self.name(version), _body(record)))
        self._put(incarnation, records)

    def record_rewrite(
        self, table: TableRef, incarnation: str, location: str, version: int, engine_version: int
    ) -> None:
        """Record the data files a maintenance rewrite (compaction) added to ``engine_version``.

        Written before the registry points readers at the rewrite; files
        already recorded are not hashed again.
        """
        known = self.recorded(incarnation)
        dataset = self.engine.open_version(location, engine_version)
        added = [p for p in fragment_file_paths(dataset.get_fragments()) if p not in known]
        if not added:
            return
        record = VersionDigests(
            table=table,
            incarnation=incarnation,
            version=version,
            files=self._digests(location, added),
        )
        self._put(incarnation, [(self.name(version, engine_version), _body(record))])

    def name(self, version: int, engine_version: int | None = None) -> str:
        rewrite = "" if engine_version is None else f"-e{engine_version}"
        return f"{version:020d}{rewrite}.json"

    def recorded(self, incarnation: str) -> dict[str, DataFileDigest]:
        """Every recorded data file of ``incarnation``, by path (read from the store)."""
        found: dict[str, DataFileDigest] = {}
        for body in self._bodies(incarnation):
            for digest in VersionDigests.model_validate_json(body).files:
                found[digest.path] = digest
        return found

    def digests_of(self, incarnation: str, paths: Sequence[str]) -> dict[str, DataFileDigest]:
        """The recorded digests of ``paths`` (those recorded), for a replica verifying them.

        Served from memory when every path is known: a data file is immutable
        and uniquely named, so its recorded digest never changes. Otherwise
        only the records not read yet (or rewritten since: a failed commit's
        version number is reused) are read, not the incarnation's whole
        history, which grows with every append.
        """
        found = self._known.lookup(incarnation, paths)
        if len(found) == len(set(paths)):
            return found
        listing = self._listing(incarnation)
        fresh = self._known.unread(incarnation, listing)
        bodies = self._read(incarnation, fresh)
        added = [
            (name, VersionDigests.model_validate_json(body).files)
            for name, body in zip(fresh, bodies, strict=True)
        ]
        self._known.add(incarnation, listing, added)
        return self._known.lookup(incarnation, paths)


class _KnownDigests:
    """Digests already read, per incarnation (LRU over incarnations, bounded in files)."""

    def __init__(self, max_files: int = 1_000_000) -> None:
        self._max_files = max_files
        #: incarnation -> (record name -> stamp read, path -> digest)
        self._by_incarnation: OrderedDict[str, tuple[dict[str, str], dict[str, DataFileDigest]]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def lookup(self, incarnation: str, paths: Sequence[str]) -> dict[str, DataFileDigest]:
        with self._lock:
            entry = self._by_incarnation.get(incarnation)
            if entry is None:
                return {}
            self._by_incarnation.move_to_end(incarnation)
            files = entry[1]
            return {path: files[path] for path in paths if path in files}

    def unread(self, incarnation: str, listing: dict[str, str]) -> list[str]:
        """Names in ``listing`` not read yet, or rewritten since they were read."""
        with self._lock:
            entry = self._by_incarnation.get(incarnation)
            seen = entry[0] if entry is not None else {}
            return sorted(name for name, stamp in listing.items() if seen.get(name) != stamp)

    def add(
        self,
        incarnation: str,
        listing: dict[str, str],
        records: Sequence[tuple[str, list[DataFileDigest]]],
    ) -> None:
        with self._lock:
            names, files = self._by_incarnation.setdefault(incarnation, ({}, {}))
            self._by_incarnation.move_to_end(incarnation)
            for name, digests in records:
                names[name] = listing[name]
                files.update((digest.path, digest) for digest in digests)
            total = sum(len(entry[1]) for entry in self._by_incarnation.values())
            while total > self._max_files and len(self._by_incarnation) > 1:
                _, (_, dropped) = self._by_incarnation.popitem(last=False)
                total -= len(dropped)


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
