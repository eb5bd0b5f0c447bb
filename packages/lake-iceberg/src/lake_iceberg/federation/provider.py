"""The ``iceberg`` catalog as Query sees it: exact lookups, pinned snapshots.

:class:`IcebergFederation` is what the plug-in entry point hands Query (it
satisfies ``lake_query.planning.external.ExternalCatalog`` by shape; the two
packages never import each other). It

- checks every configured namespace once at startup (bounded, no listing);
- at planning, answers ``iceberg.<ns>.<table>`` with the snapshot the
  replica's :class:`~lake_iceberg.federation.cache.SnapshotCache` holds (one
  exact table load on a miss), only for namespaces in the allowlist;
- at execution, point-loads the table afresh (never from the cache) and
  proves the ticket's snapshot is still retained upstream, else fails with
  :class:`~lake_core.errors.VersionReclaimed`: nothing falls forward.

Hidden (outside the allowlist) and absent namespaces and tables are all the
same :class:`~lake_core.errors.TableNotFound`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.exceptions import ValidationError
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil

from lake_core.errors import (
    ConfigError,
    LakeError,
    TableNotFound,
    Unavailable,
    VersionReclaimed,
)
from lake_iceberg.federation.cache import SnapshotCache
from lake_iceberg.federation.config import FederationConfig, catalog_file_io
from lake_iceberg.federation.contents import ManifestBytes, ManifestLists
from lake_iceberg.federation.counters import CounterSwitch, FederationCounters
from lake_iceberg.federation.fileios import FileIOs
from lake_iceberg.federation.filters import to_iceberg_filter, wrapping_columns
from lake_iceberg.federation.locations import Locations, outside
from lake_iceberg.federation.rest import RestClient
from lake_iceberg.federation.scan import PinFiles, PinnedSnapshot

__all__ = ["CATALOG", "IcebergFederation", "IcebergTable"]

#: The SQL catalog name federated tables live under.
CATALOG = "iceberg"


class IcebergTable:
    """One table of a statement at its pinned snapshot (``snapshot_id`` None: no snapshot yet)."""

    def __init__(self, pinned: PinnedSnapshot | None, namespace: str, table: str) -> None:
        self._pinned = pinned
        self.namespace = namespace
        self.table = table

    @property
    def snapshot_id(self) -> int | None:
        return None if self._pinned is None else self._pinned.snapshot_id

    @property
    def version(self) -> str | None:
        """The metadata file loaded (a new one with every upstream commit, schema changes too)."""
        return None if self._pinned is None else self._pinned.metadata_location

    def provider(self, filters: Sequence[Any] = ()) -> Any:
        """A DataFusion table provider; ``filters`` (DataFusion exprs) prune data files."""
        if self._pinned is None:
            raise TableNotFound(f"{CATALOG}.{self.namespace}.{self.table}")
        row_filter = None
        if filters:
            schema: pa.Schema = schema_to_pyarrow(self._pinned.schema, include_field_ids=False)
            row_filter = to_iceberg_filter(filters, schema, wrapping_columns(self._pinned.metadata))
        return self._pinned.provider(row_filter)

    def batches(self, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch] | None:
        """The columns ``schema`` names, every row, read without DataFusion; None: not plain."""
        if self._pinned is None:
            raise TableNotFound(f"{CATALOG}.{self.namespace}.{self.table}")
        return self._pinned.batches(schema, batch_rows)

    def scan_failure(self, error: BaseException) -> LakeError | None:
        """DataCorrupted or Unavailable when ``error`` was a storage fault, else None."""
        return None if self._pinned is None else self._pinned.scan_failure(error)


class IcebergFederation:
    """The read-only federation of one configured Iceberg REST catalog."""

    name = CATALOG

    def __init__(
        self,
        config: FederationConfig,
        *,
        counters: FederationCounters | None = None,
        rest: RestClient | None = None,
        cache: SnapshotCache[PinnedSnapshot | None] | None = None,
        files: PinFiles | None = None,
        file_io: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._switch = CounterSwitch(counters)
        #: What the federation counts into (see use_counters).
        self.counters: FederationCounters = self._switch
        self.rest = RestClient(config, counters=self.counters) if rest is None else rest
        # `is None`, not `or`: an empty cache is falsy (it has a length).
        self.cache: SnapshotCache[PinnedSnapshot | None] = (
            SnapshotCache(counters=self.counters) if cache is None else cache
        )
        self._files = files
        #: Where this catalog's tables may keep files (nothing else is opened).
        self.locations: Locations = config.locations()
        #: Manifest bytes read by this replica's direct reads (a manifest never changes).
        self.manifests = ManifestBytes()
        #: The manifests each manifest list names, as read by this replica (never rewritten).
        self.manifest_lists = ManifestLists()
        #: FileIOs (S3 clients and their connections) reused across this replica's reads.
        self.file_ios = FileIOs()
        # Extra client-side file-I/O properties (in-process tools only; never credentials
        # from configuration: Query reads with its workload identity).
        self._file_io = dict(file_io or {})

    def __repr__(self) -> str:
        return f"IcebergFederation({self.config!r})"

    def use_counters(self, counters: FederationCounters) -> None:
        """Count cache hits/misses, load failures and OAuth renewals into ``counters`` from now."""
        self._switch.target = counters

    @property
    def files(self) -> PinFiles:
        if self._files is None:
            self._files = PinFiles()
        return self._files

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """The config handshake and one bounded existence check per namespace (blocking)."""
        self.rest.handshake()
        for namespace in sorted(self.config.namespaces):
            if not self.rest.namespace_exists(namespace):
                raise ConfigError(
                    f"LAKE_ICEBERG_NAMESPACES: namespace {namespace!r} does not exist "
                    "in the Iceberg catalog"
                )

    def close(self) -> None:
        self.rest.close()
        if self._files is not None:
            self._files.close()

    # -- planning and execution ----------------------------------------------

    def visible(self, namespace: str) -> bool:
        return namespace in self.config.namespaces

    def plan(self, namespace: str, table: str) -> IcebergTable:
        """The table at the snapshot this replica currently knows (planning)."""
        self._check_visible(namespace, table)
        pinned = self.cache.get((namespace, table), lambda: self._load(namespace, table))
        if pinned is None:
            raise TableNotFound(f"{CATALOG}.{namespace}.{table}")
        return IcebergTable(pinned, namespace, table)

    def pinned(self, namespace: str, table: str, snapshot_id: int | None) -> IcebergTable:
        """The table at exactly ``snapshot_id``, proved retained by a fresh load (execution)."""
        self._check_visible(namespace, table)
        try:
            loaded = self._load(namespace, table, snapshot_id=snapshot_id, pin=True)
        except Unavailable:
            self.counters.load_failure()
            raise
        if loaded is None:
            raise TableNotFound(f"{CATALOG}.{namespace}.{table}")
        return IcebergTable(loaded, namespace, table)

    def _check_visible(self, namespace: str, table: str) -> None:
        if not self.visible(namespace):
            raise TableNotFound(f"{CATALOG}.{namespace}.{table}")

    def _load(
        self,
        namespace: str,
        table: str,
        *,
        snapshot_id: int | None = None,
        pin: bool = False,
    ) -> PinnedSnapshot | None:
        loaded = self.rest.load_table(namespace, table)
        if loaded is None:
            return None
        unreadable = Unavailable(
            f"the Iceberg catalog sent unreadable metadata for {CATALOG}.{namespace}.{table}"
        )
        try:
            metadata: TableMetadata = TableMetadataUtil.parse_obj(dict(loaded.metadata))
        except (ValueError, TypeError, ValidationError):
            # pyiceberg's own ValidationError (an unknown format version, a current
            # schema it does not list) is no ValueError, and may quote the document.
            raise unreadable from None
        if not pin:
            snapshot_id = metadata.current_snapshot_id
            if snapshot_id is not None and metadata.snapshot_by_id(snapshot_id) is None:
                raise unreadable  # a current snapshot the metadata does not list
        elif snapshot_id is not None and metadata.snapshot_by_id(snapshot_id) is None:
            raise VersionReclaimed(
                f"{CATALOG}.{namespace}.{table} snapshot {snapshot_id} is no longer retained "
                "by the Iceberg catalog; run the query again"
            )
        snapshot = None if snapshot_id is None else metadata.snapshot_by_id(snapshot_id)
        named = [loaded.metadata_location] + ([] if snapshot is None else [snapshot.manifest_list])
        if not all(self.locations.allows(location) for location in named):
            raise outside(f"{CATALOG}.{namespace}.{table}")
        properties = {
            **catalog_file_io(loaded.config),
            **self._file_io,
            **self.config.file_io_overrides(),
            **self.config.storage_bounds(),  # Lake's bound, whatever the catalog says
        }
        return PinnedSnapshot(
            namespace,
            table,
            snapshot_id,
            metadata,
            loaded.metadata_location,
            properties,
            self.files,
            storage_timeout_s=self.config.s3_timeout_s,
            manifests=self.manifests,
            file_ios=self.file_ios,
            manifest_lists=self.manifest_lists,
            locations=self.locations,
        )
