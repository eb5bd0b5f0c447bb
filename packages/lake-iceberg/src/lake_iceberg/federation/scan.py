"""A scan of one exact Iceberg snapshot, as a DataFusion table provider.

iceberg-rust's provider (``pyiceberg_core.datafusion.IcebergDataFusionTable``)
reads the *current* snapshot of the metadata file it is given, pushes
projection and LIMIT down and reads data files by field id, but prunes
nothing by filters. So Lake gives it a local copy of the table metadata
whose current snapshot (and ``main`` ref) is the pinned one; and for a
filtered scan, a copy whose snapshot points at a local manifest list and
manifest holding only the data files whose statistics may match the filter,
as pyiceberg's own planner selects them (manifest partition summaries, then
per-file column bounds). DataFusion applies the whole filter to the rows
read, so pruning can only skip files that hold no matching row.

A plain projection (no filter, no LIMIT) skips iceberg-rust: :meth:`PinnedSnapshot.batches`
reads the data files with pyarrow, several at once (:mod:`~lake_iceberg.federation.reader`),
and starts on the first files while later manifests are still being read:
planning a 40-manifest snapshot (~0.08 s) no longer precedes the first byte.

Data files and original manifests are read directly from object storage
with Query's own storage identity; the local copies are small metadata
files in a bounded directory of this replica (:class:`PinFiles`).

A failed scan is classified by :meth:`PinnedSnapshot.scan_failure`, from
the exception's type and a probe of the snapshot's files, never its text:
a missing or undecodable data file is DataCorrupted, unreachable or silent
storage Unavailable. The probe is bounded (:meth:`PinnedSnapshot.probe`):
at most :data:`PROBE_LIMIT` existence checks, never more than the files
scanned, all under one storage timeout, ending at the first decisive answer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.table import DataScan, FileScanTask
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.utils.concurrent import ExecutorFactory

from lake_core.errors import DataCorrupted, LakeError, Unavailable, Unimplemented
from lake_iceberg.federation.contents import ManifestBytes, ManifestLists
from lake_iceberg.federation.fileios import FileIOs
from lake_iceberg.federation.locations import Locations, outside
from lake_iceberg.federation.manifests import live_entries
from lake_iceberg.federation.reader import (
    DataFileError,
    StorageStalled,
    direct_columns,
    direct_file,
    direct_spec,
    name_mapping,
    plain_columns,
    read_files,
)

__all__ = ["PinFiles", "PinnedSnapshot"]

#: Pinned copies kept per replica (each a few small files).
PIN_DIRECTORIES = 512
#: Most existence checks one failed scan may make (all at once).
PROBE_LIMIT = 8
#: What pyiceberg's Avro readers raise for a truncated or garbled manifest (list):
#: short reads, negative lengths, bad UTF-8 or magic. Never the caller's mistake.
_UNDECODABLE = (EOFError, ValueError, SystemError, IndexError, OverflowError)
#: How long a probe and a direct read wait on storage, unless configured.
DEFAULT_STORAGE_TIMEOUT_S = 10.0


class PinFiles:
    """A bounded directory of pinned metadata copies, reused by content key."""

    def __init__(self, root: Path | None = None, capacity: int = PIN_DIRECTORIES) -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="lake-iceberg-pins-"))
        self.capacity = capacity
        self._dirs: OrderedDict[str, Path] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Path | None:
        with self._lock:
            found = self._dirs.get(key)
            if found is not None:
                self._dirs.move_to_end(key)
            return found

    def put(self, key: str, staged: Path) -> Path:
        """Adopt the fully written directory ``staged`` under ``key``."""
        with self._lock:
            known = self._dirs.get(key)
            if known is not None:
                shutil.rmtree(staged, ignore_errors=True)
                return known
            self._dirs[key] = staged
            evicted = []
            while len(self._dirs) > self.capacity:
                evicted.append(self._dirs.popitem(last=False)[1])
        for old in evicted:
            shutil.rmtree(old, ignore_errors=True)
        return staged

    def stage(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.root))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class PinnedSnapshot:
    """One table at one snapshot id, loaded fresh from the catalog."""

    def __init__(
        self,
        namespace: str,
        table: str,
        snapshot_id: int | None,
        metadata: TableMetadata,
        metadata_location: str,
        file_io: Mapping[str, str],
        files: PinFiles,
        storage_timeout_s: float = DEFAULT_STORAGE_TIMEOUT_S,
        manifests: ManifestBytes | None = None,
        file_ios: FileIOs | None = None,
        manifest_lists: ManifestLists | None = None,
        locations: Locations | None = None,
    ) -> None:
        self.namespace = namespace
        self.table = table
        self.snapshot_id = snapshot_id
        self.metadata = metadata
        self._location = metadata_location
        self._file_io = dict(file_io)
        self._files = files
        #: The stall bound of direct reads and of the whole failure probe.
        self._timeout_s = storage_timeout_s
        #: The replica's kept manifest bytes (lake_iceberg.federation.contents), if any.
        self._manifests = manifests
        self._manifest_lists = manifest_lists
        #: The replica's reused FileIOs (lake_iceberg.federation.fileios); None: one per call.
        self._file_ios = file_ios
        #: Where the catalog's files may be (None: anywhere, for in-process tools only).
        self._locations = locations
        # None: a table without any snapshot yet (it reads as empty).
        self._snapshot = None if snapshot_id is None else metadata.snapshot_by_id(snapshot_id)
        assert snapshot_id is None or self._snapshot is not None, "the caller checked it exists"
        #: The data files this statement scans, once planned (what a failure probes).
        self._scanned: list[FileScanTask] | None = None

    def __repr__(self) -> str:
        return f"PinnedSnapshot(iceberg.{self.namespace}.{self.table}@{self.snapshot_id})"

    @property
    def metadata_location(self) -> str:
        """The table metadata file this snapshot was loaded from."""
        return self._location

    @property
    def schema(self) -> Any:
        """The snapshot's own Iceberg schema."""
        schema_id = None if self._snapshot is None else self._snapshot.schema_id
        for schema in self.metadata.schemas:
            if schema.schema_id == schema_id:
                return schema
        return self.metadata.schema()

    def provider(self, row_filter: BooleanExpression | None = None) -> Any:
        """iceberg-rust's DataFusion provider over this snapshot, pruned by ``row_filter``."""
        from pyiceberg_core.datafusion import IcebergDataFusionTable

        pruning = (
            self._snapshot is not None
            and row_filter is not None
            and not isinstance(row_filter, AlwaysTrue)
        )
        key = self._key(row_filter if pruning else None)
        directory = self._files.get(key)
        if directory is None:
            staged = self._files.stage()
            try:
                manifest_list = self._pruned_manifest_list(staged, row_filter) if pruning else None
                if manifest_list is None and self._snapshot is not None:
                    self._tasks(None)  # iceberg-rust reads the originals: check all they name
                self._write_metadata(staged, manifest_list)
            except BaseException:
                shutil.rmtree(staged, ignore_errors=True)
                raise
            directory = self._files.put(key, staged)
        return IcebergDataFusionTable(
            [self.namespace, self.table],
            (directory / "pinned.metadata.json").as_uri(),
            self._file_io,
        )

    def _key(self, row_filter: BooleanExpression | None) -> str:
        digest = hashlib.sha256()
        digest.update(f"{self.metadata.table_uuid}\0{self.snapshot_id}\0{self._location}".encode())
        digest.update(b"\0" + repr(row_filter).encode())
        return digest.hexdigest()

    def _write_metadata(self, directory: Path, manifest_list: str | None) -> None:
        doc = json.loads(self.metadata.model_dump_json(by_alias=True, exclude_none=True))
        if manifest_list is not None:
            for snapshot in doc.get("snapshots", []):
                if snapshot.get("snapshot-id") == self.snapshot_id:
                    snapshot["manifest-list"] = manifest_list
        if self._snapshot is None:
            doc["current-snapshot-id"] = -1
            doc["refs"] = {}
        else:
            doc["current-snapshot-id"] = self.snapshot_id
            doc["refs"] = {"main": {"snapshot-id": self.snapshot_id, "type": "branch"}}
            if self._snapshot.schema_id is not None:
                doc["current-schema-id"] = self._snapshot.schema_id
        (directory / "pinned.metadata.json").write_text(json.dumps(doc))

    def _pruned_manifest_list(
        self, directory: Path, row_filter: BooleanExpression | None
    ) -> str | None:
        """A local manifest list of the data files that may match; None to scan unpruned."""
        assert self.snapshot_id is not None
        try:
            tasks = self._tasks(row_filter)
        except TypeError:
            # pyiceberg's evaluators compare the literal with a NULL partition value
            # (an identity partition of NULL rows) and fail: prune nothing instead.
            return None
        if any(task.delete_files for task in tasks):
            return None  # deletes need their sequence numbers: keep the original manifests
        by_spec: dict[int, list[DataFile]] = {}
        for task in tasks:
            by_spec.setdefault(task.file.spec_id, []).append(task.file)
        local = PyArrowFileIO()
        version = self.metadata.format_version
        manifests = []
        for index, (spec_id, files) in enumerate(sorted(by_spec.items())):
            spec = self.metadata.specs()[spec_id]
            path = (directory / f"manifest-{index}.avro").as_uri()
            with write_manifest(
                version, spec, self.schema, local.new_output(path), self.snapshot_id, "deflate"
            ) as writer:
                for data_file in files:
                    writer.add_entry(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self.snapshot_id,
                            data_file=data_file,
                        )
                    )
            manifests.append(writer.to_manifest_file())
        path = (directory / "manifest-list.avro").as_uri()
        snapshot = self._snapshot
        assert snapshot is not None
        assert self.snapshot_id is not None
        with write_manifest_list(
            version,
            local.new_output(path),
            self.snapshot_id,
            snapshot.parent_snapshot_id,
            snapshot.sequence_number,
            "deflate",
        ) as manifest_list:
            manifest_list.add_manifests(manifests)
        return path

    # -- direct reads and failures --------------------------------------------

    def batches(self, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch] | None:
        """Every row of the columns ``schema`` names, read by pyarrow; None: not a plain scan.

        The data files are read as the iterator is consumed,
        :data:`~lake_iceberg.federation.reader.READAHEAD_FILES` at a time.
        When the manifest list shows only data manifests of partition specs
        the reader handles, the plan streams (:meth:`_streamed_tasks`): each
        manifest's files are handed to the reader as it is read, so the first
        Parquet reads overlap the rest of the planning. Otherwise (delete
        manifests, identity partitions) the whole plan is made here first.
        """
        if self._snapshot is None:
            return iter(())
        field_ids = direct_columns(self.schema, schema.names)
        if field_ids is None:
            return None
        io = self._io()
        tasks = self._streamed_tasks(io)
        if tasks is None:
            planned = self._tasks(None)
            if plain_columns(self.metadata, self.schema, schema.names, planned) is None:
                return None
            tasks = iter(planned)
        return read_files(
            io,
            tasks,
            field_ids,
            schema,
            batch_rows,
            mapping=name_mapping(self.metadata),
            stall_s=self._timeout_s,
        )

    def _streamed_tasks(self, io: FileIO) -> Iterator[FileScanTask] | None:
        """The snapshot's data files as its manifests are read; None: plan them whole.

        Reads the manifest list now (one request, unless this replica kept
        what it lists: :class:`~lake_iceberg.federation.contents.ManifestLists`). A stream yields exactly
        what :meth:`_tasks` returns without a filter, in the same order: the
        live, non-empty entries of every manifest (what ``plan_files`` keeps
        when nothing is filtered), read all at once on pyiceberg's planning
        pool by :func:`~lake_iceberg.federation.manifests.live_entries`. Only
        when each file becomes known, and the CPU spent, differ.

        Allowed only when no manifest holds deletes and every manifest's
        partition spec keeps its values in the files: the facts the
        direct-read decision needs before the first byte. A data file that
        is not Parquet is only found once its manifest is read; the stream
        then fails with :class:`~lake_core.errors.Unimplemented` (the eager
        plan handed such a snapshot to iceberg-rust's scan instead).
        """
        assert self._snapshot is not None
        path = self._snapshot.manifest_list
        kept = None if self._manifest_lists is None else self._manifest_lists.get(path)
        try:
            manifests = self._snapshot.manifests(io) if kept is None else list(kept)
        except FileNotFoundError:  # the manifest list of a retained snapshot is gone
            raise self.corrupted() from None
        except OSError:
            raise self.unreachable() from None
        except _UNDECODABLE:  # a manifest (list) that is truncated or garbled
            raise self.corrupted() from None
        specs = self.metadata.specs()
        if any(
            manifest.content != ManifestContent.DATA
            or not direct_spec(specs, manifest.partition_spec_id)
            for manifest in manifests
        ):
            return None
        self._confine(manifest.manifest_path for manifest in manifests)  # before any is read
        if kept is None and self._manifest_lists is not None:
            self._manifest_lists.put(path, manifests)
        return self._stream(io, manifests)

    def _stream(self, io: FileIO, manifests: Sequence[ManifestFile]) -> Iterator[FileScanTask]:
        scanned: list[FileScanTask] = []
        self._scanned = scanned  # what a failure probes: the files handed out so far
        # All at once on pyiceberg's own planning pool, in order, as plan_files does.
        pool = ExecutorFactory.get_or_create()
        try:
            kept = self._manifests
            for entries in pool.map(lambda manifest: live_entries(io, manifest, kept), manifests):
                for entry in entries:
                    if entry.data_file.record_count == 0:
                        continue  # as plan_files' metrics evaluator (empty files are skipped)
                    self._confine([entry.data_file.file_path])
                    task = FileScanTask(entry.data_file)
                    if entry.data_file.content != DataFileContent.DATA or not direct_file(task):
                        raise Unimplemented(
                            f"iceberg.{self.namespace}.{self.table} snapshot {self.snapshot_id}: "
                            f"data file format {task.file.file_format} cannot be read"
                        )
                    scanned.append(task)
                    yield task
        except FileNotFoundError:  # a manifest of a retained snapshot is gone
            raise self.corrupted() from None
        except OSError:
            raise self.unreachable() from None
        except _UNDECODABLE:  # a manifest (list) that is truncated or garbled
            raise self.corrupted() from None

    def scan_failure(self, error: BaseException) -> LakeError | None:
        """The storage fault behind a failed scan of this snapshot, or None if storage is whole.

        Decided by type (the reader's :class:`DataFileError` carries pyarrow's
        exception) and by probing the scanned files, never by message text.
        """
        if isinstance(error, LakeError) or self._snapshot is None:
            return None
        if isinstance(error, StorageStalled):
            return self.unreachable()  # probing a silent store would only wait again
        if isinstance(error, DataFileError):
            paths = [error.path]
        elif self._scanned:
            paths = [task.file.file_path for task in self._scanned]
        else:
            try:
                paths = self._first_data_files(PROBE_LIMIT)
            except LakeError as typed:
                return typed
        found = self.probe(paths)
        if found is not None:
            return found
        if isinstance(error, DataFileError):
            # The file is there: an I/O fault is transient, anything else undecodable.
            return self.unreachable() if isinstance(error.cause, OSError) else self.corrupted()
        return None

    def probe(self, paths: Sequence[str]) -> LakeError | None:
        """DataCorrupted if one of the first :data:`PROBE_LIMIT` ``paths`` is gone,
        Unavailable if storage fails or stays silent, None if every file checked is there.

        The checks run at once, one existence request each, and the first
        decisive answer ends the probe; those not yet answered are abandoned
        (each still ends at the S3 client's own timeout). A failed scan of many
        files therefore costs at most :data:`PROBE_LIMIT` requests and one
        storage timeout; a missing file beyond the first few goes unnamed
        (None: the caller keeps the scan's own error).
        """
        checked = list(paths[:PROBE_LIMIT])
        if not checked:
            return None
        io = self._io()
        pool = ThreadPoolExecutor(len(checked), thread_name_prefix="lake-iceberg-probe")
        try:
            pending: set[Future[bool]] = {
                pool.submit(lambda path=path: io.new_input(path).exists()) for path in checked
            }
            deadline = time.monotonic() + self._timeout_s
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self.unreachable()  # a silent store answers nothing in time
                done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
                for future in done:
                    error = future.exception()
                    if isinstance(error, OSError):
                        return self.unreachable()
                    if error is not None:
                        raise error
                    if not future.result():
                        return self.corrupted()
            return None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def corrupted(self) -> DataCorrupted:
        return DataCorrupted(
            f"iceberg.{self.namespace}.{self.table} snapshot {self.snapshot_id}: a data file "
            "of this snapshot is missing or unreadable in the Iceberg table's storage"
        )

    def unreachable(self) -> Unavailable:
        return Unavailable(
            f"iceberg.{self.namespace}.{self.table}: the Iceberg table's storage is "
            "unreachable right now; retry"
        )

    def _confine(self, locations: Iterable[str]) -> None:
        """Refuse, before anything is opened, a file the catalog placed outside the location."""
        if self._locations is not None and not all(map(self._locations.allows, locations)):
            raise outside(f"iceberg.{self.namespace}.{self.table}")

    def _first_data_files(self, count: int) -> list[str]:
        """Up to ``count`` live data files of the snapshot, in manifest order.

        For a scan Lake never planned (iceberg-rust's, unpruned): only the first
        manifests are read, not the whole snapshot's, and iceberg-rust reads
        data files in this same order.
        """
        assert self._snapshot is not None
        io = self._io()
        found: list[str] = []
        try:
            for manifest in self._snapshot.manifests(io):
                if manifest.content != ManifestContent.DATA:
                    continue
                self._confine([manifest.manifest_path])
                for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                    self._confine([entry.data_file.file_path])
                    found.append(entry.data_file.file_path)
                    if len(found) >= count:
                        return found
        except FileNotFoundError:  # a manifest (list) of a retained snapshot is gone
            raise self.corrupted() from None
        except OSError:
            raise self.unreachable() from None
        except _UNDECODABLE:  # a manifest (list) that is truncated or garbled
            raise self.corrupted() from None
        return found

    def _io(self) -> FileIO:
        if self._file_ios is not None:
            return self._file_ios.get(self._file_io, self._location)
        return load_file_io(self._file_io, self._location)

    def _tasks(self, row_filter: BooleanExpression | None) -> list[FileScanTask]:
        """The snapshot's data files that may match ``row_filter`` (manifest reads)."""
        io = self._io()
        scan = DataScan(
            self.metadata,
            io,
            row_filter=row_filter if row_filter is not None else AlwaysTrue(),
            snapshot_id=self.snapshot_id,
        )
        try:
            if self._snapshot is not None:  # the list is read (and kept by pyiceberg) once
                self._confine(manifest.manifest_path for manifest in self._snapshot.manifests(io))
            tasks = list(scan.plan_files())
        except FileNotFoundError:  # a manifest of a retained snapshot is gone
            raise self.corrupted() from None
        except OSError:
            raise self.unreachable() from None
        except _UNDECODABLE:  # a manifest (list) that is truncated or garbled
            raise self.corrupted() from None
        self._confine(file.file_path for task in tasks for file in (task.file, *task.delete_files))
        self._scanned = tasks
        return tasks
