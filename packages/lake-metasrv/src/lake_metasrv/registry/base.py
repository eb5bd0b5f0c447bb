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
import asyncio
import base64
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from lake_core.models import CatalogEntry, Engine, TableDescriptor
from lake_core.names import TableRef
from lake_core.protocol import AppendResult
from lake_core.schemas import schema_from_ipc

__all__ = [
    "OPERATION_ID_SEPARATOR",
    "AppendCommit",
    "AppendOperation",
    "DroppedTable",
    "MaintenanceCommit",
    "OperationRecord",
    "RegistryStore",
    "TableRecord",
    "VersionRecord",
    "join_operation_ids",
    "split_operation_ids",
]


@functools.lru_cache(maxsize=1024)
def _schema(schema_ipc: bytes) -> pa.Schema:
    # Every append checks its rows against its table's schema: parse each one once
    # (a record's bytes keep their hash, so a hit costs a dict lookup).
    return schema_from_ipc(schema_ipc)


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
        return _schema(self.schema_ipc)

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
    """One committed Lake version of one incarnation, and the appends it holds."""

    incarnation: str
    version: int
    engine_version: int
    committed_at_ms: int
    #: Every append committed as this version (a commit group), in commit order;
    #: empty for the version a create made.
    operation_ids: tuple[str, ...] = ()

    @property
    def operation_id(self) -> str | None:
        """The group's first append (None for a create)."""
        return self.operation_ids[0] if self.operation_ids else None


#: Separates the operation ids of one version where a store keeps them in one
#: string (UUIDv7 ids never contain it).
OPERATION_ID_SEPARATOR = ","


def join_operation_ids(operation_ids: Sequence[str]) -> str | None:
    """The stored form of a version's operation ids (None when it has none)."""
    return OPERATION_ID_SEPARATOR.join(operation_ids) or None


def split_operation_ids(stored: str | None) -> tuple[str, ...]:
    """The operation ids of a stored version (one id: a version from before groups)."""
    return tuple(stored.split(OPERATION_ID_SEPARATOR)) if stored else ()


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
class AppendOperation:
    """One append of a commit group: its id, and the time the id was stamped with."""

    operation_id: str
    operation_time_ms: int


@dataclass(frozen=True)
class AppendCommit:
    """The compare-and-swap a commit group asks the registry to apply.

    One new version, ``expected_version + 1``, holding every append of the
    group: the first is ``operation_id``/``operation_time_ms``, the others
    are ``also`` (empty for a lone append). Every one of them gets its own
    operation record naming the shared version, atomically with the version.
    """

    table: TableRef
    incarnation: str
    expected_version: int
    engine_version: int
    operation_id: str
    operation_time_ms: int
    committed_at_ms: int
    also: tuple[AppendOperation, ...] = ()

    @property
    def operations(self) -> tuple[AppendOperation, ...]:
        return (AppendOperation(self.operation_id, self.operation_time_ms), *self.also)

    @property
    def operation_ids(self) -> tuple[str, ...]:
        return tuple(op.operation_id for op in self.operations)

    @property
    def version(self) -> int:
        return self.expected_version + 1

    @classmethod
    def of_group(
        cls,
        table: TableRef,
        incarnation: str,
        expected_version: int,
        engine_version: int,
        operations: Sequence[AppendOperation],
        committed_at_ms: int,
    ) -> AppendCommit:
        first, *rest = operations
        return cls(
            table,
            incarnation,
            expected_version,
            engine_version,
            first.operation_id,
            first.operation_time_ms,
            committed_at_ms,
            tuple(rest),
        )


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

        The new version holds every operation of ``commit`` (a commit group):
        the version history, one operation record per operation id (each
        naming the shared version) and the generation change together, all
        or none. Raises TableNotFound if the table or incarnation is gone,
        StaleReadVersion if the version moved, and InvalidAppend if any of
        the operation ids is already committed (then none is).
        """

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

    async def get_table_and_operations(
        self, table: TableRef, operation_ids: Sequence[str]
    ) -> tuple[TableRecord | None, dict[str, OperationRecord]]:
        """A commit group's first read: the table, and which of its ids already committed.

        Read concurrently here; a store may answer both in one round trip.
        """
        record, found = await asyncio.gather(
            self.get_table(table), self.get_operations(operation_ids)
        )
        return record, found

    @abc.abstractmethod
    async def prune_operations(self, older_than_ms: int) -> int:
        """Forget operation ids whose UUIDv7 time is before ``older_than_ms``."""

    @abc.abstractmethod
    async def versions(self, incarnation: str) -> list[VersionRecord]:
        """Every committed version of one incarnation, oldest first."""

    @abc.abstractmethod
    async def version_record(self, incarnation: str, version: int) -> VersionRecord | None:
        """One committed version of one incarnation (None: no record of it, or not yet)."""

    async def first_version_after(
        self, incarnation: str, after_ms: int, newest: int
    ) -> VersionRecord | None:
        """The oldest of versions ``0..newest`` committed after ``after_ms``, by bisection.

        Versions commit one after another, so their times rise with them:
        about log2(newest) point reads, where a time-travel walk through the
        table's history reads one version at a time. None when none is
        later, or when a record it reads is missing (a cloud registry writes
        a version's record just after the version became visible).
        """
        low, high = 0, newest
        found: VersionRecord | None = None
        while low <= high:
            middle = (low + high) // 2
            record = await self.version_record(incarnation, middle)
            if record is None:
                return None
            if record.committed_at_ms > after_ms:
                found, high = record, middle - 1
            else:
                low = middle + 1
        return found

    @abc.abstractmethod
    async def dropped_tables(self) -> list[DroppedTable]: ...
