"""Opening pinned Lance versions, and what a storage failure means.

Lance reports every failure as a ``ValueError`` whose only distinction is
its text, so Query never reads that text. After Lance fails, a
:class:`~lake_core.storage_probe.StorageProbe` asks the store itself, through pyarrow's file
systems, which answer in types: a file is there or ``FileType.NotFound``,
and an unreachable store raises ``OSError``.

An S3 table's pinned version is opened from S3 alone (Lance copies each
committed manifest to its version's path), so a DynamoDB outage does not stop
reads; only a manifest a crash left named in DynamoDB alone is opened through
it, and :class:`ManifestTableProbe` asks that table when this fails. That
decides the Lake error:

    the store or the manifest table cannot be reached -> Unavailable (retry)
    the pinned version's manifest is gone             -> VersionReclaimed
    a data file of the pinned version is gone         -> VersionReclaimed
    everything is there but cannot be read            -> DataCorrupted (at open)

The probe runs only on the failure path; a healthy query never pays for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import lance

from lake_core.cloud import DatasetStorage
from lake_core.errors import (
    DataCorrupted,
    LakeError,
    Unavailable,
    Unimplemented,
    VersionReclaimed,
)
from lake_core.models import TableDescriptor, incarnation_of
from lake_core.names import TableRef
from lake_core.storage_probe import MAX_PROBED_FILES, StorageProbe
from lake_query.planning.manifests import ManifestTableProbe
from lake_query.planning.pinned import PinnedDatasets
from lake_query.planning.verify import DataFileVerifier
from lake_query.planning.version_files import VersionFiles
from lake_query.planning.versions import StepReader

__all__ = ["MAX_PROBED_FILES", "DatasetOpener", "StorageProbe", "open_pinned"]

#: Tables whose last read a replica remembers (for verifying ahead).
MAX_TRACKED_TABLES = 10_000


class DatasetOpener:
    """Opens pinned versions for one replica (it owns the cache of opened datasets)."""

    def __init__(
        self,
        storage: DatasetStorage | None = None,
        cache: PinnedDatasets | None = None,
        *,
        verifier: DataFileVerifier | None = None,
        verify_on_open: bool = True,
    ) -> None:
        self.storage = storage or DatasetStorage()
        self._cache = cache
        self._probe = StorageProbe(self.storage)
        self._manifests = ManifestTableProbe(self.storage)
        self._version_files = VersionFiles(self.storage)
        #: Checks data files against their commit's digests: before any row is
        #: served with LAKE_QUERY_VERIFY_ON_OPEN (default), and after every failed scan.
        self._verifier = verifier
        self._verify_on_open = verify_on_open
        #: When a query last opened each table (location, incarnation): monotonic seconds.
        self._read_at: dict[tuple[str, str], float] = {}

    def read_within(self, descriptor: TableDescriptor, seconds: float) -> bool:
        """Whether a query opened ``descriptor``'s table in the last ``seconds``."""
        at = self._read_at.get((descriptor.location, descriptor.incarnation))
        return at is not None and time.monotonic() - at <= seconds

    def version_steps(
        self, dataset: Any, head: TableDescriptor, *, ahead: bool = True
    ) -> StepReader:
        """How a walk back from ``head`` reads each version (:mod:`.version_files`)."""
        return self._version_files.steps(dataset, head, ahead=ahead)

    def open(self, table: TableRef, descriptor: TableDescriptor, *, ahead: bool = False) -> Any:
        """The Lance dataset at exactly ``descriptor``'s version, or a typed Lake error.

        ``ahead``: opened before any query asked (:mod:`lake_query.planning.verify_ahead`),
        which does not count as a read of the table.
        """
        if not ahead:
            key = (descriptor.location, descriptor.incarnation)
            if len(self._read_at) >= MAX_TRACKED_TABLES and key not in self._read_at:
                self._read_at.clear()  # a replica past this many tables forgets which are warm
            self._read_at[key] = time.monotonic()
        if descriptor.engine != "lance":
            raise Unimplemented(
                f"{table.qualified}: table engine {descriptor.engine!r} is not supported"
            )
        storage = self.storage
        location = descriptor.location
        uri = storage.lance_uri(location)

        def opener() -> Any:
            if uri != location:  # S3: the registered version is read from S3 alone
                committed_uri, options = storage.committed_read(location)
                try:
                    return lance.dataset(
                        committed_uri, version=descriptor.engine_version, storage_options=options
                    )
                except (ValueError, OSError):
                    pass  # reclaimed, unreachable, or its manifest never left DynamoDB
            return lance.dataset(
                uri,
                version=descriptor.engine_version,
                storage_options=storage.storage_options(location),
            )

        try:
            if self._cache is None:
                dataset = opener()
            else:
                dataset = self._cache.open(
                    uri, descriptor.incarnation, descriptor.engine_version, opener
                )
        except (ValueError, OSError):
            raise self._open_failure(table, descriptor) from None
        if incarnation_of(dataset.schema.metadata or {}) != descriptor.incarnation:
            # Metasrv stamps every dataset with its incarnation, because a table
            # dropped and recreated at one location restarts Lance's versions.
            raise VersionReclaimed(
                f"{table.qualified} version {descriptor.version} is no longer available: "
                "the table was dropped and recreated since the query was planned; "
                "run the query again"
            )
        if self._verifier is not None and self._verify_on_open:
            self._verifier.check(dataset, table, descriptor)
        return dataset

    def _open_failure(self, table: TableRef, descriptor: TableDescriptor) -> LakeError:
        try:
            present = self._probe.version_exists(descriptor.location, descriptor.engine_version)
        except OSError:
            return _unreachable(table)
        if not present:
            return _reclaimed(table, descriptor)
        if not self._manifests.reachable(descriptor.location):
            return _unreachable(table)  # every file is there, but Lance cannot resolve versions
        return DataCorrupted(
            f"{table.qualified} version {descriptor.version} cannot be read: "
            "its stored files are damaged or unreadable"
        )

    def scan_failure(
        self, pinned: Iterable[tuple[TableRef, TableDescriptor, Any]]
    ) -> LakeError | None:
        """The storage error behind a failed scan of ``pinned``, or None if storage is whole."""
        for table, descriptor, dataset in pinned:
            try:
                if not self._probe.version_exists(
                    descriptor.location, descriptor.engine_version
                ) or not self._probe.data_files_exist(descriptor.location, dataset):
                    return VersionReclaimed(
                        f"{table.qualified} version {descriptor.version} was reclaimed while "
                        "the query ran; run the query again"
                    )
            except OSError:
                return Unavailable("table storage became unreachable while the query ran; retry")
            if self._verifier is not None:
                try:
                    self._verifier.check(dataset, table, descriptor, recheck=True)
                except (DataCorrupted, VersionReclaimed) as failure:
                    return failure
        return None


def _unreachable(table: TableRef) -> Unavailable:
    return Unavailable(f"{table.qualified}: table storage is unreachable right now; retry")


def _reclaimed(table: TableRef, descriptor: TableDescriptor) -> VersionReclaimed:
    return VersionReclaimed(
        f"{table.qualified} version {descriptor.version} is no longer available "
        "(retention reclaimed it, or the table was dropped); run the query again "
        "to read the current version"
    )


def open_pinned(
    table: TableRef, descriptor: TableDescriptor, storage: DatasetStorage | None = None
) -> Any:
    """Open one pinned version without a cache (tools and tests)."""
    return DatasetOpener(storage).open(table, descriptor)
