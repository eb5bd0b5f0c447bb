"""The digest-store seam: size and SHA-256 of every data file a commit writes.

At commit time, beside each version's reference-delta sidecar, Metasrv
writes the digests of the data files that version added (durable before the
registry moves, like the sidecar). Local tables keep them in the data
directory, S3 tables beside their sidecars in the bucket:

    <data-dir>/integrity/<incarnation>/<version>.json
    s3://<bucket>/<table prefix>/_lake-integrity/<incarnation>/<version:020d>.json

A compaction adds ``<version>-e<engine version>.json`` for the files it
rewrote. Data files are immutable and Lance names each one uniquely, so the
union of an incarnation's records names every file any of its versions
reads. :func:`~lake_metasrv.digests.verify.verify_table` recomputes them for
the current version (or every retained version) and reports each file that
differs or is gone.

On S3 the data files are read back after Lance wrote them (one GET each,
concurrent with the Lance commit): Lance writes them itself and exposes no
digest of what it sent.

:class:`DigestStore` is the seam;
:class:`~lake_metasrv.digests.local.LocalDigestStore` keeps records in the
data directory and :class:`~lake_metasrv.digests.s3.S3DigestStore` in the bucket.
"""

from __future__ import annotations

import abc
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lake_core.errors import Internal, Unavailable
from lake_core.integrity import DataFileDigest, DataFileReader, fragment_file_paths
from lake_core.names import TableRef
from lake_metasrv.engine.base import LanceEngine

__all__ = ["DigestStore", "VersionDigests"]


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
