"""The local registry: one SQLite file, WAL journal, ``synchronous=FULL``.

All statements run on one connection guarded by a lock, in a worker thread
so the event loop never waits on an fsync. Writes use ``BEGIN IMMEDIATE`` so
each compare-and-swap reads and writes under the same write lock.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar, cast

from lake_core.errors import (
    Internal,
    InvalidAppend,
    StaleReadVersion,
    TableExists,
    TableNotFound,
)
from lake_core.models import Engine
from lake_core.names import TableRef
from lake_metasrv.registry.base import (
    AppendCommit,
    DroppedTable,
    MaintenanceCommit,
    OperationRecord,
    RegistryStore,
    TableRecord,
    VersionRecord,
    join_operation_ids,
    split_operation_ids,
)

__all__ = ["SqliteRegistry"]

T = TypeVar("T")
LAYOUT_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS registry_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tables (
    namespace      TEXT    NOT NULL,
    name           TEXT    NOT NULL,
    incarnation    TEXT    NOT NULL UNIQUE,
    location       TEXT    NOT NULL,
    engine         TEXT    NOT NULL,
    schema_ipc     BLOB    NOT NULL,
    version        INTEGER NOT NULL CHECK (version >= 0),
    engine_version INTEGER NOT NULL CHECK (engine_version >= 1),
    created_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);
CREATE TABLE IF NOT EXISTS table_versions (
    incarnation     TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    engine_version  INTEGER NOT NULL,
    committed_at_ms INTEGER NOT NULL,
    operation_id    TEXT,  -- the version's operation ids, comma-separated (a commit group)
    PRIMARY KEY (incarnation, version)
);
CREATE TABLE IF NOT EXISTS append_operations (
    operation_id      TEXT    PRIMARY KEY,
    namespace         TEXT    NOT NULL,
    name              TEXT    NOT NULL,
    incarnation       TEXT    NOT NULL,
    location          TEXT    NOT NULL,
    engine            TEXT    NOT NULL,
    version           INTEGER NOT NULL,
    engine_version    INTEGER NOT NULL,
    operation_time_ms INTEGER NOT NULL,
    committed_at_ms   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS append_operations_by_time
    ON append_operations (operation_time_ms);
CREATE TABLE IF NOT EXISTS dropped_tables (
    incarnation     TEXT    PRIMARY KEY,
    namespace       TEXT    NOT NULL,
    name            TEXT    NOT NULL,
    location        TEXT    NOT NULL,
    dropped_version INTEGER NOT NULL,
    dropped_at_ms   INTEGER NOT NULL
);
"""

_TABLE_COLUMNS = (
    "namespace, name, incarnation, location, engine, schema_ipc, version, "
    "engine_version, created_at_ms"
)
_OPERATION_COLUMNS = (
    "operation_id, namespace, name, incarnation, location, engine, version, "
    "engine_version, operation_time_ms, committed_at_ms"
)


def _table_record(row: sqlite3.Row) -> TableRecord:
    return TableRecord(
        table=TableRef(row["namespace"], row["name"]),
        incarnation=row["incarnation"],
        location=row["location"],
        engine=cast(Engine, row["engine"]),
        schema_ipc=bytes(row["schema_ipc"]),
        version=row["version"],
        engine_version=row["engine_version"],
        created_at_ms=row["created_at_ms"],
    )


_VERSION_COLUMNS = "incarnation, version, engine_version, committed_at_ms, operation_id"


def _version_record(row: sqlite3.Row) -> VersionRecord:
    return VersionRecord(
        incarnation=row["incarnation"],
        version=row["version"],
        engine_version=row["engine_version"],
        committed_at_ms=row["committed_at_ms"],
        operation_ids=split_operation_ids(row["operation_id"]),
    )


def _operation_record(row: sqlite3.Row) -> OperationRecord:
    return OperationRecord(
        operation_id=row["operation_id"],
        table=TableRef(row["namespace"], row["name"]),
        incarnation=row["incarnation"],
        location=row["location"],
        engine=cast(Engine, row["engine"]),
        version=row["version"],
        engine_version=row["engine_version"],
        operation_time_ms=row["operation_time_ms"],
        committed_at_ms=row["committed_at_ms"],
    )


class SqliteRegistry(RegistryStore):
    """:class:`RegistryStore` in a local SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._registry_id = ""

    def __repr__(self) -> str:
        return f"SqliteRegistry({str(self.path)!r})"

    # -- plumbing ---------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._locked, fn)

    def _locked(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._conn is None:
                raise Internal(f"registry {self.path} is not open")
            return fn(self._conn)

    @staticmethod
    @contextmanager
    def _write(conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _bump_generation(conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "UPDATE registry_meta SET value = CAST(value AS INTEGER) + 1 "
            "WHERE key = 'generation' RETURNING CAST(value AS INTEGER)"
        ).fetchone()
        return int(row[0])

    def _generation_text(self, counter: int) -> str:
        # The registry id makes a generation from a recreated registry differ
        # from any the caller saw before, so not_modified is never a false hit.
        return f"{self._registry_id}:{counter}"

    @staticmethod
    def _read_generation(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM registry_meta WHERE key = 'generation'").fetchone()
        return int(row[0])

    # -- lifecycle --------------------------------------------------------

    async def open(self) -> None:
        if self._conn is not None:
            return
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise Internal(f"registry {self.path} could not switch to WAL (got {mode})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=10000")
            with self._write(conn):
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT OR IGNORE INTO registry_meta VALUES ('registry_id', ?)",
                    (str(uuid.uuid4()),),
                )
                conn.execute("INSERT OR IGNORE INTO registry_meta VALUES ('generation', '0')")
                conn.execute(
                    "INSERT OR IGNORE INTO registry_meta VALUES ('layout_version', ?)",
                    (LAYOUT_VERSION,),
                )
            meta = dict(conn.execute("SELECT key, value FROM registry_meta").fetchall())
        except BaseException:
            conn.close()
            raise
        if meta["layout_version"] != LAYOUT_VERSION:
            conn.close()
            raise Internal(
                f"registry {self.path} has layout {meta['layout_version']}, "
                f"this Metasrv reads layout {LAYOUT_VERSION}"
            )
        self._registry_id = meta["registry_id"]
        with self._lock:
            self._conn = conn

    async def close(self) -> None:
        def close(conn: sqlite3.Connection) -> None:
            conn.close()
            self._conn = None

        if self._conn is not None:
            await self._run(close)

    # -- reads ------------------------------------------------------------

    async def generation(self) -> str:
        return self._generation_text(await self._run(self._read_generation))

    async def get_table(self, table: TableRef) -> TableRecord | None:
        return await self._run(lambda conn: self._read_table(conn, table))

    async def get_table_and_operations(
        self, table: TableRef, operation_ids: Sequence[str]
    ) -> tuple[TableRecord | None, dict[str, OperationRecord]]:
        """Both reads on one worker-thread hop (they share the connection's lock anyway)."""

        def get(conn: sqlite3.Connection) -> tuple[TableRecord | None, dict[str, OperationRecord]]:
            return self._read_table(conn, table), self._read_operations(conn, operation_ids)

        return await self._run(get)

    @staticmethod
    def _read_table(conn: sqlite3.Connection, table: TableRef) -> TableRecord | None:
        row = conn.execute(
            f"SELECT {_TABLE_COLUMNS} FROM tables WHERE namespace = ? AND name = ?",
            (table.namespace, table.name),
        ).fetchone()
        return None if row is None else _table_record(row)

    async def snapshot(self) -> tuple[str, list[TableRecord]]:
        def snap(conn: sqlite3.Connection) -> tuple[int, list[TableRecord]]:
            # One read transaction: the generation matches the rows exactly.
            conn.execute("BEGIN")
            try:
                counter = self._read_generation(conn)
                rows = conn.execute(
                    f"SELECT {_TABLE_COLUMNS} FROM tables ORDER BY namespace, name"
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            return counter, [_table_record(r) for r in rows]

        counter, records = await self._run(snap)
        return self._generation_text(counter), records

    async def get_operation(self, operation_id: str) -> OperationRecord | None:
        def get(conn: sqlite3.Connection) -> OperationRecord | None:
            row = conn.execute(
                f"SELECT {_OPERATION_COLUMNS} FROM append_operations WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()
            return None if row is None else _operation_record(row)

        return await self._run(get)

    async def get_operations(self, operation_ids: Sequence[str]) -> dict[str, OperationRecord]:
        return await self._run(lambda conn: self._read_operations(conn, operation_ids))

    @staticmethod
    def _read_operations(
        conn: sqlite3.Connection, operation_ids: Sequence[str]
    ) -> dict[str, OperationRecord]:
        found: dict[str, OperationRecord] = {}
        ids = list(dict.fromkeys(operation_ids))
        for start in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
            chunk = ids[start : start + 500]
            rows = conn.execute(
                f"SELECT {_OPERATION_COLUMNS} FROM append_operations "
                f"WHERE operation_id IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for row in rows:
                record = _operation_record(row)
                found[record.operation_id] = record
        return found

    async def versions(self, incarnation: str) -> list[VersionRecord]:
        def get(conn: sqlite3.Connection) -> list[VersionRecord]:
            rows = conn.execute(
                f"SELECT {_VERSION_COLUMNS} FROM table_versions "
                "WHERE incarnation = ? ORDER BY version",
                (incarnation,),
            ).fetchall()
            return [_version_record(r) for r in rows]

        return await self._run(get)

    async def version_record(self, incarnation: str, version: int) -> VersionRecord | None:
        def get(conn: sqlite3.Connection) -> VersionRecord | None:
            row = conn.execute(
                f"SELECT {_VERSION_COLUMNS} FROM table_versions "
                "WHERE incarnation = ? AND version = ?",
                (incarnation, version),
            ).fetchone()
            return None if row is None else _version_record(row)

        return await self._run(get)

    async def dropped_tables(self) -> list[DroppedTable]:
        def get(conn: sqlite3.Connection) -> list[DroppedTable]:
            rows = conn.execute(
                "SELECT namespace, name, incarnation, location, dropped_version, dropped_at_ms "
                "FROM dropped_tables ORDER BY dropped_at_ms"
            ).fetchall()
            return [
                DroppedTable(
                    table=TableRef(r["namespace"], r["name"]),
                    incarnation=r["incarnation"],
                    location=r["location"],
                    dropped_version=r["dropped_version"],
                    dropped_at_ms=r["dropped_at_ms"],
                )
                for r in rows
            ]

        return await self._run(get)

    # -- writes -----------------------------------------------------------

    async def create_table(self, record: TableRecord) -> str:
        if record.version != 0:
            raise Internal("a new table starts at version 0")

        def create(conn: sqlite3.Connection) -> int:
            with self._write(conn):
                exists = conn.execute(
                    "SELECT 1 FROM tables WHERE namespace = ? AND name = ?",
                    (record.table.namespace, record.table.name),
                ).fetchone()
                if exists:
                    raise TableExists(record.table)
                conn.execute(
                    f"INSERT INTO tables ({_TABLE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.table.namespace,
                        record.table.name,
                        record.incarnation,
                        record.location,
                        record.engine,
                        record.schema_ipc,
                        record.version,
                        record.engine_version,
                        record.created_at_ms,
                    ),
                )
                conn.execute(
                    "INSERT INTO table_versions VALUES (?, 0, ?, ?, NULL)",
                    (record.incarnation, record.engine_version, record.created_at_ms),
                )
                return self._bump_generation(conn)

        return self._generation_text(await self._run(create))

    async def drop_table(self, table: TableRef, incarnation: str, dropped_at_ms: int) -> str:
        def drop(conn: sqlite3.Connection) -> int:
            with self._write(conn):
                row = conn.execute(
                    f"SELECT {_TABLE_COLUMNS} FROM tables WHERE namespace = ? AND name = ?",
                    (table.namespace, table.name),
                ).fetchone()
                if row is None or row["incarnation"] != incarnation:
                    raise TableNotFound(table)
                conn.execute(
                    "DELETE FROM tables WHERE namespace = ? AND name = ?",
                    (table.namespace, table.name),
                )
                conn.execute(
                    "INSERT INTO dropped_tables VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        incarnation,
                        table.namespace,
                        table.name,
                        row["location"],
                        row["version"],
                        dropped_at_ms,
                    ),
                )
                return self._bump_generation(conn)

        return self._generation_text(await self._run(drop))

    async def commit_append(self, commit: AppendCommit) -> TableRecord:
        """One commit group's version and every operation record, in one transaction (one fsync)."""

        def cas(conn: sqlite3.Connection) -> TableRecord:
            with self._write(conn):
                record = self._apply_append(conn, commit)
                self._bump_generation(conn)
            return record

        return await self._run(cas)

    @staticmethod
    def _apply_append(conn: sqlite3.Connection, commit: AppendCommit) -> TableRecord:
        table = commit.table
        row = conn.execute(
            f"SELECT {_TABLE_COLUMNS} FROM tables WHERE namespace = ? AND name = ?",
            (table.namespace, table.name),
        ).fetchone()
        if row is None or row["incarnation"] != commit.incarnation:
            raise TableNotFound(table)
        if row["version"] != commit.expected_version:
            raise StaleReadVersion(
                f"table {table} is at version {row['version']}, not {commit.expected_version}"
            )
        ids = commit.operation_ids
        if len(set(ids)) != len(ids):
            raise InvalidAppend("an operation id appears twice in one commit group")
        for start in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
            chunk = ids[start : start + 500]
            seen = conn.execute(
                f"SELECT operation_id FROM append_operations "
                f"WHERE operation_id IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchone()
            if seen:
                raise InvalidAppend(f"operation id {seen[0]} is already committed")
        version = commit.version
        conn.execute(
            "UPDATE tables SET version = ?, engine_version = ? "
            "WHERE namespace = ? AND name = ? AND incarnation = ? AND version = ?",
            (
                version,
                commit.engine_version,
                table.namespace,
                table.name,
                commit.incarnation,
                commit.expected_version,
            ),
        )
        conn.execute(
            "INSERT INTO table_versions VALUES (?, ?, ?, ?, ?)",
            (
                commit.incarnation,
                version,
                commit.engine_version,
                commit.committed_at_ms,
                join_operation_ids(ids),
            ),
        )
        conn.executemany(
            f"INSERT INTO append_operations ({_OPERATION_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    op.operation_id,
                    table.namespace,
                    table.name,
                    commit.incarnation,
                    row["location"],
                    row["engine"],
                    version,
                    commit.engine_version,
                    op.operation_time_ms,
                    commit.committed_at_ms,
                )
                for op in commit.operations
            ],
        )
        updated = conn.execute(
            f"SELECT {_TABLE_COLUMNS} FROM tables WHERE namespace = ? AND name = ?",
            (table.namespace, table.name),
        ).fetchone()
        return _table_record(updated)

    async def commit_maintenance(self, commit: MaintenanceCommit) -> TableRecord:
        def cas(conn: sqlite3.Connection) -> TableRecord:
            table = commit.table
            with self._write(conn):
                row = conn.execute(
                    f"SELECT {_TABLE_COLUMNS} FROM tables WHERE namespace = ? AND name = ?",
                    (table.namespace, table.name),
                ).fetchone()
                if row is None or row["incarnation"] != commit.incarnation:
                    raise TableNotFound(table)
                if (row["version"], row["engine_version"]) != (
                    commit.expected_version,
                    commit.expected_engine_version,
                ):
                    raise StaleReadVersion(
                        f"table {table} is at version {row['version']} (Lance "
                        f"{row['engine_version']}), not {commit.expected_version} (Lance "
                        f"{commit.expected_engine_version}); maintenance not applied"
                    )
                conn.execute(
                    "UPDATE tables SET engine_version = ? "
                    "WHERE namespace = ? AND name = ? AND incarnation = ?",
                    (commit.new_engine_version, table.namespace, table.name, commit.incarnation),
                )
                # The history row of this Lake version follows the head, so
                # versions() never names a Lance version the head moved away from.
                conn.execute(
                    "UPDATE table_versions SET engine_version = ? "
                    "WHERE incarnation = ? AND version = ?",
                    (commit.new_engine_version, commit.incarnation, commit.expected_version),
                )
                self._bump_generation(conn)
                updated = conn.execute(
                    f"SELECT {_TABLE_COLUMNS} FROM tables WHERE namespace = ? AND name = ?",
                    (table.namespace, table.name),
                ).fetchone()
            return _table_record(updated)

        return await self._run(cas)

    async def prune_operations(self, older_than_ms: int) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            with self._write(conn):
                cursor = conn.execute(
                    "DELETE FROM append_operations WHERE operation_time_ms < ?",
                    (older_than_ms,),
                )
                return cursor.rowcount

        return await self._run(prune)
