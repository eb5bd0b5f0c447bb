"""Opening pinned Lance versions, and what a storage failure means.

Lance reports every failure as a ``ValueError`` whose only distinction is
its text, so Query never reads that text. After Lance fails, a
:class:`StorageProbe` asks the store itself, through pyarrow's file
systems, which answer in types: a file is there or ``FileType.NotFound``,
and an unreachable store raises ``OSError``. That decides the Lake error:

    the store cannot be reached                 -> Unavailable (retry)
    the pinned version's manifest is gone       -> VersionReclaimed
    a data file of the pinned version is gone   -> VersionReclaimed
    everything is there but cannot be read      -> DataCorrupted (at open)

The probe runs only on the failure path; a healthy query never pays for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lance
import pyarrow.fs as pafs

from lake_core.cloud import DatasetStorage, split_s3_uri
from lake_core.errors import (
    DataCorrupted,
    LakeError,
    Unavailable,
    Unimplemented,
    VersionReclaimed,
)
from lake_core.models import TableDescriptor, incarnation_of
from lake_core.names import TableRef
from lake_query.planning.pinned import PinnedDatasets
from lake_query.verify import DataFileVerifier

__all__ = ["DatasetOpener", "StorageProbe", "open_pinned"]

_U64_MAX = 2**64 - 1
#: Data files checked after a failed scan; more are not worth the requests.
MAX_PROBED_FILES = 256


class StorageProbe:
    """Typed questions to a table's store (blocking; only after a failure)."""

    def __init__(self, storage: DatasetStorage) -> None:
        self._storage = storage
        self._s3: pafs.FileSystem | None = None

    def _where(self, location: str) -> tuple[pafs.FileSystem, str]:
        if not self._storage.is_s3(location):
            return pafs.LocalFileSystem(), location.rstrip("/")
        if self._s3 is None:
            self._s3 = self._s3_filesystem()
        bucket, key = split_s3_uri(location)
        return self._s3, f"{bucket}/{key.rstrip('/')}"

    def _s3_filesystem(self) -> pafs.FileSystem:
        storage = self._storage
        options = storage.storage_options("s3://probe/x") or {}
        endpoint = storage.s3_endpoint or ""
        seconds = max(0.1, storage.timeout_ms / 1000)
        return pafs.S3FileSystem(
            access_key=options.get("aws_access_key_id"),
            secret_key=options.get("aws_secret_access_key"),
            session_token=options.get("aws_session_token"),
            region=storage.region or "us-east-1",
            endpoint_override=endpoint.split("://", 1)[-1] or None,
            scheme="http" if endpoint.startswith("http://") else "https",
            connect_timeout=min(seconds, 3.0),
            request_timeout=seconds,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )

    def _exists(self, fs: pafs.FileSystem, paths: Iterable[str]) -> list[bool]:
        # OSError (unreachable, denied) propagates: the caller maps it.
        return [info.type != pafs.FileType.NotFound for info in fs.get_file_info(list(paths))]

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


class DatasetOpener:
    """Opens pinned versions for one replica (it owns the cache of opened datasets)."""

    def __init__(
        self,
        storage: DatasetStorage | None = None,
        cache: PinnedDatasets | None = None,
        *,
        verifier: DataFileVerifier | None = None,
        verify_on_open: bool = False,
    ) -> None:
        self.storage = storage or DatasetStorage()
        self._cache = cache
        self._probe = StorageProbe(self.storage)
        #: Checks data files against their commit's digests: before any row is
        #: served with LAKE_QUERY_VERIFY_ON_OPEN, and after every failed scan.
        self._verifier = verifier
        self._verify_on_open = verify_on_open

    def open(self, table: TableRef, descriptor: TableDescriptor) -> Any:
        """The Lance dataset at exactly ``descriptor``'s version, or a typed Lake error."""
        if descriptor.engine != "lance":
            raise Unimplemented(
                f"{table.qualified}: table engine {descriptor.engine!r} is not supported"
            )
        storage = self.storage
        uri = storage.lance_uri(descriptor.location)

        def opener() -> Any:
            return lance.dataset(
                uri,
                version=descriptor.engine_version,
                storage_options=storage.storage_options(descriptor.location),
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
                except DataCorrupted as corrupted:
                    return corrupted
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
