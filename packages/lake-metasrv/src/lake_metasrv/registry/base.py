"""The registry seam: what Metasrv needs from its durable catalog.

The registry is Lake's visibility boundary. A table version exists for
readers when, and only when, the registry points at it; the storage engine
may hold versions the registry never saw (a crash between the two commits),
and those stay invisible forever.

Implementations: :class:`~lake_metasrv.registry.sqlite.SqliteRegistry`
(local mode) and :class:`~lake_metasrv.registry.dynamo.DynamoRegistry`
(cloud mode); both pass the same tests.
"""

from __future__ import annotations

import abc
import base64
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from lake_core.models import CatalogEntry, Engine, TableDescriptor
from lake_core.names import TableRef
from lake_core.protocol import AppendResult
from lake_core.schemas import schema_from_ipc

__all__ = [
    "AppendCommit",
    "DroppedTable",
    "MaintenanceCommit",
    "OperationRecord",
    "RegistryStore",
    "TableRecord",
    "VersionRecord",
]


@dataclass(frozen=True)
class TableRecord:
    """One live table: its incarnation and the version readers may see."""

    table: TableRef
    incarnation: str
    location: str
    engine: Engine
    schema_ipc: bytes
    version: int
    engine_version: int
    created_at_ms: int

    @property
    def schema(self) -> pa.Schema:
        return schema_from_ipc(self.schema_ipc)

    def descriptor(self) -> TableDescriptor:
        return TableDescriptor(
            location=self.location,
            engine=self.engine,
            incarnation=self.incarnation,
            version=self.version,
            engine_version=self.engine_version,
        )

    def catalog_entry(self) -> CatalogEntry:
        return CatalogEntry(
            table=self.table,
            descriptor=self.descriptor(),
            schema_ipc=base64.b64encode(self.schema_ipc).decode("ascii"),
        )


@dataclass(frozen=True)
class VersionRecord:
    """One committed Lake version of one incarnation."""

    incarnation: str
    version: int
    engine_version: int
    committed_at_ms: int
    operation_id: str | None


@dataclass(frozen=True)
class OperationRecord:
    """A committed append, remembered so a retry can be answered, not re-applied."""

    operation_id: str
    table: TableRef
    incarnation: str
    location: str
    engine: Engine
    version: int
    engine_version: int
    operation_time_ms: int
    committed_at_ms: int

    def result(self, *, replayed: bool) -> AppendResult:
        descriptor = TableDescriptor(
            location=self.location,
            engine=self.engine,
            incarnation=self.incarnation,
            version=self.version,
            engine_version=self.engine_version,
        )
        return AppendResult(
            table=self.table,
            operation_id=self.operation_id,
            version=self.version,
            descriptor=descriptor,
            replayed=replayed,
        )


@dataclass(frozen=True)
class DroppedTable:
    """A dropped incarnation, kept so GC can tell dead sidecars from live ones."""

    table: TableRef
    incarnation: str
    location: str
    dropped_version: int
    dropped_at_ms: int


@dataclass(frozen=True)
class AppendCommit:
    """The compare-and-swap an append asks the registry to apply."""

    table: TableRef
    incarnation: str
    expected_version: int
    engine_version: int
    operation_id: str
    operation_time_ms: int
    committed_at_ms: int


@dataclass(frozen=True)
class MaintenanceCommit:
    """The compare-and-swap a maintenance commit (compaction, index) asks for.

    The table keeps its Lake version and its rows; only the Lance version
    readers are pointed at moves, from ``expected_engine_version`` to
    ``new_engine_version``.
    """

    table: TableRef
    incarnation: str
    expected_version: int
    expected_engine_version: int
    new_engine_version: int


class RegistryStore(abc.ABC):
    """Durable catalog of tables, versions and append operations.

    Every mutation bumps the directory generation, an opaque string that
    changes whenever the set of tables or any table's version changes; it is
    never reused, even by a registry recreated at the same path.
    """

    @abc.abstractmethod
    async def open(self) -> None:
        """Create or open the store (idempotent)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def generation(self) -> str: ...

    @abc.abstractmethod
    async def get_table(self, table: TableRef) -> TableRecord | None: ...

    @abc.abstractmethod
    async def snapshot(self) -> tuple[str, list[TableRecord]]:
        """The generation and every live table, read consistently together."""

    async def snapshot_if_changed(
        self, generation: str | None
    ) -> tuple[str, list[TableRecord] | None]:
        """The current generation, and every live table unless ``generation`` is current.

        Stores override this to answer an unchanged catalog without reading it.
        """
        current, records = await self.snapshot()
        return (current, None) if generation == current else (current, records)

    @abc.abstractmethod
    async def create_table(self, record: TableRecord) -> str:
        """Insert a table at its version 0; raise TableExists. Returns the generation."""

    @abc.abstractmethod
    async def drop_table(self, table: TableRef, incarnation: str, dropped_at_ms: int) -> str:
        """Remove the live table if it is still ``incarnation``; raise TableNotFound."""

    @abc.abstractmethod
    async def commit_append(self, commit: AppendCommit) -> TableRecord:
        """Atomically move a table from ``expected_version`` to the next version.

        Records the version history and the operation id and bumps the
        generation in one transaction. Raises TableNotFound if the table or
        incarnation is gone, StaleReadVersion if the version moved, and
        InvalidAppend if the operation id is already committed.
        """

    #: How many consecutive appends one :meth:`commit_appends` call applies atomically.
    atomic_append_batch: int = 1

    async def commit_appends(self, commits: Sequence[AppendCommit]) -> list[TableRecord]:
        """Apply consecutive appends to one table atomically: all of them, or none.

        ``commits[i + 1].expected_version`` is ``commits[i].expected_version + 1``;
        at most :attr:`atomic_append_batch` of them. Returns the table after each.
        Stores without multi-append transactions keep the default (one at a time).
        """
        self._check_append_batch(commits)
        return [await self.commit_append(commits[0])]

    def _check_append_batch(self, commits: Sequence[AppendCommit]) -> None:
        if not 1 <= len(commits) <= self.atomic_append_batch:
            raise ValueError(
                f"{type(self).__name__} commits 1..={self.atomic_append_batch} appends at once, "
                f"got {len(commits)}"
            )
        for before, after in itertools.pairwise(commits):
            if (after.table, after.incarnation) != (before.table, before.incarnation) or (
                after.expected_version != before.expected_version + 1
            ):
                raise ValueError("batched appends must be consecutive versions of one table")

    @abc.abstractmethod
    async def commit_maintenance(self, commit: MaintenanceCommit) -> TableRecord:
        """Atomically point the current Lake version at a new Lance version.

        Applies only if the table is still ``incarnation`` at exactly
        ``expected_version`` and ``expected_engine_version``; the version
        history row of that Lake version moves too (so ``versions()`` agrees
        with the head), and the generation is bumped so catalog caches
        refresh. Raises TableNotFound if the table or incarnation is gone and
        StaleReadVersion if the table moved on. Previously issued tickets keep
        the old Lance version, readable until Lance retention reclaims it.
        """

    @abc.abstractmethod
    async def get_operation(self, operation_id: str) -> OperationRecord | None: ...

    async def get_operations(self, operation_ids: Sequence[str]) -> dict[str, OperationRecord]:
        """The committed operations among ``operation_ids`` (stores may answer in one read)."""
        found: dict[str, OperationRecord] = {}
        for operation_id in operation_ids:
            record = await self.get_operation(operation_id)
            if record is not None:
                found[operation_id] = record
        return found

    @abc.abstractmethod
    async def prune_operations(self, older_than_ms: int) -> int:
        """Forget operation ids whose UUIDv7 time is before ``older_than_ms``."""

    @abc.abstractmethod
    async def versions(self, incarnation: str) -> list[VersionRecord]:
        """Every committed version of one incarnation, oldest first."""

    @abc.abstractmethod
    async def dropped_tables(self) -> list[DroppedTable]: ...
