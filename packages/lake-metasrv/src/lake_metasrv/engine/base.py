"""The table-engine seam: Lance's commit protocol and retention, off the event loop.

The registry is the visibility boundary. The engine may hold a version the
registry never recorded (a crash between the Lance commit and the registry
commit); such an orphan must never become visible, not even through a later
append that Lance would happily stack on top of it. So an append is a
compare-and-swap on the Lance version: the pre-written fragments are
committed at ``read_version = registered`` and the result is kept only if it
is exactly ``registered + 1``. Otherwise Lance rebased it over an orphan: the
registered version is restored (a new Lance version with exactly its
content) and the fragments are committed again on top. Lake versions stay
gap-free; Lance versions may skip.

Appends come in groups (the commit coordinator batches concurrent appends
to one table): a group is ONE Lance version, one ``LanceOperation.Append``
of every fragment the group wrote, its files fsync'd in one pass; the
version's transaction properties name the appends it holds.

:class:`LanceEngine` is the table-engine seam: it holds the commit protocol
and leaves where datasets live to its two implementations, chosen at
construction: :class:`~lake_metasrv.engine.local.LocalLanceEngine` (a data
directory, fsync'd by Lake) and :class:`~lake_metasrv.engine.s3.S3LanceEngine`
(S3 with Lance's commit pointer in DynamoDB). Each says what a commit must
make durable through :class:`WrittenFiles`.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import structlog
from lance.dataset import Transaction

from lake_core.cloud import DatasetStorage
from lake_core.errors import Internal, Unavailable, VersionReclaimed
from lake_core.models import Engine, incarnation_of
from lake_core.names import TableRef
from lake_core.storage_probe import StorageProbe
from lake_metasrv.config import DEFAULT_RETAIN_MIN_AGE_SECS

__all__ = [
    "OPERATION_IDS_PROPERTY",
    "LanceEngine",
    "PreparedAppend",
    "WrittenFiles",
    "reclaim_old_versions",
    "replaced_since",
]

log = structlog.get_logger("lake_metasrv.engine")

#: The Lance transaction property naming the appends (operation ids, comma-separated)
#: a version holds; ``t$versions`` lists them.
OPERATION_IDS_PROPERTY = "lake.operation_ids"


class LanceEngine(abc.ABC):
    """Lance tables: the commit protocol over a storage chosen by the implementation.

    Every public coroutine runs its Lance work off the event loop.
    """

    name: Engine = "lance"

    def __init__(
        self,
        retain_versions: int,
        *,
        retain_min_age_secs: int = DEFAULT_RETAIN_MIN_AGE_SECS,
        cleanup_every: int | None = None,
        fence: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= retain_versions <= 10_000:
            raise ValueError("retain_versions must be in 1..=10000")
        if retain_min_age_secs < 0:
            raise ValueError("retain_min_age_secs must be >= 0")
        self.retain_versions = retain_versions
        #: A version replaced less than this long ago is kept whatever the count window
        #: says (see :func:`reclaim_old_versions`).
        self.retain_min_age_secs = retain_min_age_secs
        #: Wall clock retention compares with Lance's commit timestamps (tests move it).
        self.clock = clock
        #: Least time between two retention passes of one table: a tenth of the age
        #: floor (90 s at the default), so a pass (which reads every retained
        #: manifest) stays rare while versions it could reclaim wait at most 10% longer.
        self.cleanup_interval_s = retain_min_age_secs / 10
        self._cleaned_at: dict[str, float] = {}
        #: Retention runs once this many versions were committed since its last run,
        #: so between runs a table holds up to ``retain + cleanup_every - 1`` versions
        #: (never fewer than ``retain``). Default: half the window, at least 1.
        self.cleanup_every = cleanup_every or max(1, retain_versions // 2)
        #: Raises unless this node may still commit (checked before each Lance commit).
        self.fence: Callable[[], object] = fence or (lambda: None)
        # location -> (incarnation, the dataset at the version this engine last committed).
        # Metasrv is the only writer, so the handle stays current until it commits again.
        self._datasets: dict[str, tuple[str, Any]] = {}
        self._since_cleanup: dict[str, int] = {}
        #: Asks the store, in types, what a Lance failure meant (local paths here).
        self.probe = StorageProbe(DatasetStorage())

    def read_failure(self, location: str, engine_version: int, exc: BaseException) -> BaseException:
        """What a failed open of ``engine_version`` means, asked of the store (never Lance's text).

        Its manifest gone -> VersionReclaimed; the store unreachable ->
        Unavailable; otherwise :meth:`storage_error` decides.
        """
        try:
            present = self.probe.version_exists(location, engine_version)
        except OSError:
            return Unavailable(f"storage for {location} is unreachable; retry")
        if not present:
            return VersionReclaimed(f"version {engine_version} of {location} has been reclaimed")
        return self.storage_error(location, exc)

    # -- where datasets live (each implementation) ---------------------------

    @abc.abstractmethod
    def location(self, table: TableRef) -> str:
        """The registry location of a new table's dataset."""

    @abc.abstractmethod
    def uri(self, location: str) -> str:
        """What Lance opens for a registry location."""

    @abc.abstractmethod
    def storage_options(self, location: str) -> dict[str, str] | None:
        """Lance's storage options for a location (None: a local path)."""

    @abc.abstractmethod
    def local_path(self, location: str) -> Path | None:
        """The directory Lake must fsync after Lance writes there (None: stores are durable)."""

    @abc.abstractmethod
    def storage_error(self, location: str, exc: BaseException) -> BaseException:
        """What a storage-level failure means to the caller."""

    @abc.abstractmethod
    def written_files(self, location: str) -> WrittenFiles:
        """What must be made durable before the registry may point at a commit."""

    @abc.abstractmethod
    async def create(self, location: str, schema: pa.Schema, incarnation: str) -> int:
        """Create an empty dataset owned by ``incarnation``; return its Lance version.

        The caller guarantees no registered table uses ``location``: anything
        already there is the leftover of a crashed create or drop and is removed.
        """

    @abc.abstractmethod
    async def remove(self, location: str) -> None:
        """Delete a dropped table's dataset (best effort; the registry already forgot it)."""

    @abc.abstractmethod
    async def read(self, location: str, engine_version: int) -> pa.Table:
        """The rows of one exact version (for tools and tests; Query reads directly)."""

    @abc.abstractmethod
    def cleanup_now(self, location: str, registered_version: int) -> int:
        """Reclaim the versions outside both windows (count and age), never tagged ones."""

    def forget(self) -> None:
        """Drop cached dataset handles (the next append reopens from the registry's version)."""
        self._datasets.clear()

    # -- append -----------------------------------------------------------

    async def append(
        self, location: str, incarnation: str, registered_version: int, data: pa.Table
    ) -> int:
        """Append ``data`` on top of the registered version; return the new Lance version."""
        prepared = await self.prepare(location, incarnation, registered_version, data, sync=False)
        return await self.commit_group(location, incarnation, registered_version, [prepared])

    async def prepare(
        self,
        location: str,
        incarnation: str,
        registered_version: int,
        data: pa.Table,
        *,
        sync: bool = True,
    ) -> PreparedAppend:
        """Write ``data`` as fragments (in no version yet), outside any table lock.

        Until a commit references them the files are invisible; Lance's
        cleanup leaves recent unreferenced files alone, so a concurrent
        retention pass cannot take them. With ``sync=False`` the data files
        are not fsync'd here but by :meth:`commit_group`, in the same pass
        as the manifest (for rows written just before their commit: one
        round of fsyncs instead of two).
        """
        return await asyncio.to_thread(
            self._prepare, location, incarnation, registered_version, data, sync
        )

    def prepare_stream(
        self,
        location: str,
        incarnation: str,
        registered_version: int,
        reader: pa.RecordBatchReader,
    ) -> PreparedAppend:
        """Blocking :meth:`prepare` of a stream: fragments written as batches arrive.

        Lance rolls files over at its row and byte bounds, so memory stays
        bounded whatever the stream's length (a bulk ingest, lake_metasrv.ingest).
        """
        return self._prepare(location, incarnation, registered_version, reader)

    def _prepare(
        self,
        location: str,
        incarnation: str,
        registered_version: int,
        data: pa.Table | pa.RecordBatchReader,
        sync: bool = True,
    ) -> PreparedAppend:
        owner, cached = self._datasets.get(location, ("", None))
        try:
            # Any version of this incarnation has the right schema and storage format.
            target = cached if cached is not None and owner == incarnation else None
            if target is None:
                target = self._open_uncached(location, incarnation, registered_version)
            fragments = lance.fragment.write_fragments(
                data, target, storage_options=self.storage_options(location)
            )
            if sync:
                self.written_files(location).sync_data(fragments)
        except (ValueError, OSError, pa.ArrowException) as exc:
            raise self.storage_error(location, exc) from None
        return PreparedAppend(incarnation, fragments, synced=sync)

    async def commit_group(
        self,
        location: str,
        incarnation: str,
        registered_version: int,
        prepared: Sequence[PreparedAppend],
        operation_ids: Sequence[str] = (),
    ) -> int:
        """Commit every prepared append's fragments as ONE Lance version on the registered one.

        ``prepared`` holds a commit group's fragments (the group's small
        appends written together, and any append written before it queued);
        ``operation_ids`` are recorded in the version's transaction
        properties (``lake.operation_ids``), where ``t$versions`` reads them.
        One manifest commit and one fsync pass (the new manifest and
        transaction files, their directories, and the data files of appends
        prepared with ``sync=False``); returns the new Lance version.
        """
        return await asyncio.to_thread(
            self._commit_group, location, incarnation, registered_version, prepared, operation_ids
        )

    def _commit_group(
        self,
        location: str,
        incarnation: str,
        registered_version: int,
        prepared: Sequence[PreparedAppend],
        operation_ids: Sequence[str],
    ) -> int:
        options = self.storage_options(location)
        written = self.written_files(location)
        written.before_commits()
        fragments: list[Any] = []
        unsynced: list[Any] = []
        for append in prepared:
            if append.incarnation != incarnation:
                raise Internal(f"fragments written for another incarnation of {location}")
            fragments.extend(append.fragments)
            if not append.synced:
                unsynced.extend(append.fragments)
        properties = {OPERATION_IDS_PROPERTY: ",".join(operation_ids)} if operation_ids else {}
        try:
            base = self._open(location, incarnation, registered_version)
            operation = lance.LanceOperation.Append(fragments)
            self.fence()
            committed = lance.LanceDataset.commit(
                base,
                _transaction(base.version, operation, properties),
                read_version=base.version,
                storage_options=options,
            )
            if committed.version != base.version + 1:
                committed = self._restore_then_commit(
                    location, base.version, committed, operation, properties
                )
            # Nothing may be registered that might not survive a crash.
            written.sync_commits(unsynced)
        except BaseException as exc:
            self._datasets.pop(location, None)
            if isinstance(exc, ValueError | OSError | pa.ArrowException):
                raise self.storage_error(location, exc) from None
            raise
        self._datasets[location] = (incarnation, committed)
        self._since_cleanup[location] = self._since_cleanup.get(location, 0) + 1
        return int(committed.version)

    def _open(self, location: str, incarnation: str, version: int) -> Any:
        """The dataset at the registered ``version``; cached while this engine is its writer."""
        owner, cached = self._datasets.get(location, ("", None))
        if cached is not None and owner == incarnation and cached.version == version:
            return cached
        dataset = self._open_uncached(location, incarnation, version)
        self._datasets[location] = (incarnation, dataset)
        return dataset

    def open_version(self, location: str, version: int) -> Any:
        """The dataset at Lance ``version``, uncached (Lance's errors propagate)."""
        return lance.dataset(
            self.uri(location), version=version, storage_options=self.storage_options(location)
        )

    def _open_uncached(self, location: str, incarnation: str, version: int) -> Any:
        try:
            dataset = lance.dataset(
                self.uri(location), version=version, storage_options=self.storage_options(location)
            )
        except (ValueError, OSError) as exc:
            error = self.storage_error(location, exc)
            if isinstance(error, Unavailable):
                raise error from None
            raise Internal(
                f"cannot open {location} at registered version {version}: {exc}"
            ) from None
        owner = incarnation_of(dataset.schema.metadata)
        if owner != incarnation:
            raise Internal(
                f"dataset {location} belongs to incarnation {owner or '?'}, "
                f"the registry says {incarnation}"
            )
        return dataset

    def _restore_then_commit(
        self,
        location: str,
        registered: int,
        latest: Any,
        operation: Any,
        properties: dict[str, str] | None = None,
    ) -> Any:
        """Our commit landed on unregistered versions: restore the registered one, retry."""
        options = self.storage_options(location)
        log.warning(
            "restoring registered version over unregistered Lance versions",
            location=location,
            registered=registered,
            latest=latest.version,
        )
        restore = lance.LanceOperation.Restore(registered)
        self.fence()
        restored = lance.LanceDataset.commit(
            latest, restore, read_version=latest.version, storage_options=options
        )
        if restored.version != latest.version + 1:
            raise Unavailable(f"another writer is committing to {location}; retry")
        committed = lance.LanceDataset.commit(
            restored,
            _transaction(restored.version, operation, properties or {}),
            read_version=restored.version,
            storage_options=options,
        )
        if committed.version != restored.version + 1:
            raise Unavailable(f"another writer is committing to {location}; retry")
        return committed

    # -- reads and retention ----------------------------------------------

    async def cleanup(self, location: str, registered_version: int) -> int:
        """Reclaim the Lance versions outside both retention windows (never tagged ones).

        A version is reclaimed only when it is not among the newest
        ``retain_versions`` AND was replaced more than ``retain_min_age_secs``
        ago (:func:`reclaim_old_versions`). Runs once ``cleanup_every``
        versions were committed since the last pass, at most every
        ``cleanup_interval_s``, and only when the registered version is the
        latest, so it can never reclaim the version readers are told to use.
        Returns versions removed.
        """
        if not self._cleanup_due(location, time.monotonic()):
            # Most appends: decided here, without a hop to a worker thread and back.
            return 0
        return await asyncio.to_thread(self._cleanup, location, registered_version)

    def _cleanup_due(self, location: str, now: float) -> bool:
        if self._since_cleanup.get(location, 0) < self.cleanup_every:
            return False
        return now - self._cleaned_at.get(location, float("-inf")) >= self.cleanup_interval_s

    def _cleanup(self, location: str, registered_version: int) -> int:
        now = time.monotonic()
        if not self._cleanup_due(location, now):
            return 0
        self._since_cleanup[location] = 0
        self._cleaned_at[location] = now
        return self.cleanup_now(location, registered_version)


def _transaction(read_version: int, operation: Any, properties: dict[str, str]) -> Any:
    """A Lance transaction carrying Lake's properties (which appends a version holds)."""
    return Transaction(
        read_version=read_version, operation=operation, transaction_properties=properties
    )


@dataclass(frozen=True)
class PreparedAppend:
    """An append's rows written as fragments that no version references yet."""

    incarnation: str
    fragments: list[Any]
    #: Whether the data files are durable already; if not, the commit that
    #: references them makes them durable with its manifest.
    synced: bool = True


class WrittenFiles(abc.ABC):
    """What a commit's Lance writes need before the registry may point at them."""

    @abc.abstractmethod
    def before_commits(self) -> None:
        """Note what exists now, so :meth:`sync_commits` can tell what is new."""

    @abc.abstractmethod
    def sync_data(self, fragments: Iterable[Any]) -> None:
        """Make the data files of ``fragments`` durable."""

    @abc.abstractmethod
    def sync_commits(self, fragments: Iterable[Any] = ()) -> None:
        """Make the commits' new manifests, transactions and directory entries durable,
        and the data files of ``fragments`` (written without :meth:`sync_data`)."""


def reclaim_old_versions(
    dataset: Any,
    location: str,
    registered_version: int,
    retain_versions: int,
    *,
    min_age_secs: int = 0,
    now: float | None = None,
) -> int | None:
    """Apply retention to ``dataset``; None when skipped because Lance is ahead of the registry.

    A version is reclaimed only when it is outside BOTH windows: not among
    the newest ``retain_versions``, and replaced (a newer version committed)
    more than ``min_age_secs`` before ``now``. The age counts from when a
    version stopped being the newest, not from its own commit: a table idle
    for an hour still serves tickets planned on its head a moment before the
    next append. Tagged versions are kept whatever their age.

    Lance's own ``cleanup_old_versions(older_than, retain_versions)`` removes
    a version only when both say so (measured with pylance 14), but its age
    is the version's own commit time; so the count passed to Lance is
    widened to every version whose successor is younger than the floor,
    computed here from the versions' commit timestamps (a binary search of
    single-manifest reads) against ``now`` (Metasrv's clock, the one Lance
    stamped them with), and Lance is given no age of its own. Data files are deleted only when no retained manifest references
    them, and files no commit references yet (an append's fragments written
    before its commit) stay for Lance's 7-day unverified window.
    """
    if dataset.latest_version != registered_version:
        log.warning(
            "skipping retention: latest Lance version is not the registered one",
            location=location,
            registered=registered_version,
            latest=dataset.latest_version,
        )
        return None
    keep = retain_versions
    if min_age_secs > 0:
        cutoff = (time.time() if now is None else now) - min_age_secs
        keep = max(keep, replaced_since(dataset, cutoff))
    stats = dataset.cleanup_old_versions(
        older_than=timedelta(0),  # the age floor is in ``keep``
        retain_versions=keep,
        error_if_tagged_old_versions=False,
    )
    return int(stats.old_versions)


def replaced_since(dataset: Any, cutoff: float) -> int:
    """How many newest versions were the head at or after ``cutoff`` (unix seconds).

    That is the versions committed at or after ``cutoff`` plus the one they
    replaced; 1 (the latest) when nothing was committed since. Versions are
    numbered contiguously and committed in order, and a reclaimed one (its
    manifest gone) is older than any retained one, so a binary search finds
    the oldest version committed at or after ``cutoff``.
    """
    latest = int(dataset.latest_version)

    def young(version: int) -> bool:
        try:
            stamp = dataset.checkout_version(version).get_version()["timestamp"]
        except (ValueError, OSError):
            return False  # reclaimed already: older than everything retained
        # Lance gives a naive local-time datetime; .timestamp() reads it as local time.
        return float(stamp.timestamp()) >= cutoff

    if not young(latest):
        return 1
    low, high = 1, latest  # the oldest young version is in [low, high]
    while low < high:
        middle = (low + high) // 2
        if young(middle):
            high = middle
        else:
            low = middle + 1
    return latest - low + 2 if low > 1 else latest
