"""Registry roots: what the registry points at, read without a running Metasrv.

A plan binds the roots it was made against: every table's head
(incarnation, Lake version, Lance engine version), every dropped
incarnation, and the registry's directory generation. Apply reads them
again before every page: a head that moved since planning is read forward
through its new sidecars (lake_gc.since), and another registry is refused.

GC is a separate worker: it reads the registry's own storage read-only
(the data directory's SQLite file, or the cloud DynamoDB table) in the
layouts Metasrv writes (``lake_metasrv.registry``; tests/gc proves the two
agree by reading what a real Metasrv wrote). It never writes the registry.
"""

from __future__ import annotations

import abc
import hashlib
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from lake_core.errors import DataCorrupted, FailedPrecondition, Unavailable

__all__ = ["DynamoRoots", "RegistryRoots", "RootsSource", "SqliteRoots", "TableRoot"]

#: Directory shards of the cloud registry's ``dir#<n>`` family.
DIR_SHARDS = 4


class TableRoot(BaseModel):
    """One table's head: what readers of the table are pointed at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str
    incarnation: str
    version: int
    engine_version: int


class RegistryRoots(BaseModel):
    """Every head, every dropped incarnation and the generation, read consistently."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    registry: str
    generation: str
    tables: list[TableRoot]
    dropped: list[str]

    @property
    def live(self) -> set[str]:
        return {t.incarnation for t in self.tables}

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


class RootsSource(abc.ABC):
    """Reads the registry's roots (blocking)."""

    @abc.abstractmethod
    def read(self) -> RegistryRoots: ...


class SqliteRoots(RootsSource):
    """The local registry: ``<data-dir>/registry.sqlite3``, opened read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> RegistryRoots:
        if not self.path.exists():
            raise FailedPrecondition(
                f"no registry at {self.path}: is --data-dir the data directory of `lake meta`?"
            )
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute("BEGIN")  # one read transaction: heads and generation agree
            meta = dict(conn.execute("SELECT key, value FROM registry_meta").fetchall())
            heads = conn.execute(
                "SELECT namespace, name, incarnation, version, engine_version FROM tables "
                "ORDER BY namespace, name"
            ).fetchall()
            dropped = conn.execute("SELECT incarnation FROM dropped_tables ORDER BY 1").fetchall()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _sqlite_error(exc, self.path) from None
        finally:
            conn.close()
        if "registry_id" not in meta or "generation" not in meta:
            raise _not_a_registry(self.path)
        return RegistryRoots(
            registry=f"sqlite:{self.path.resolve()}",
            generation=f"{meta['registry_id']}:{meta['generation']}",
            tables=[
                TableRoot(table=f"{ns}.{name}", incarnation=inc, version=v, engine_version=ev)
                for ns, name, inc, v, ev in heads
            ],
            dropped=[row[0] for row in dropped],
        )


#: SQLite result codes of a file that is no Lake registry: not a database
#: (SQLITE_NOTADB) or without the registry's tables (SQLITE_ERROR).
_NOT_A_REGISTRY = {26, 1}
_SQLITE_CORRUPT = 11


def _sqlite_error(exc: sqlite3.Error, path: Path) -> Exception:
    """Typed by SQLite's result code: a wrong file is the caller's, a busy one retryable."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code in _NOT_A_REGISTRY:
        return _not_a_registry(path)
    if code == _SQLITE_CORRUPT:
        return DataCorrupted(f"the registry at {path} is damaged (SQLite reports corruption)")
    return Unavailable(f"cannot read the registry at {path}: {exc}; retry")


def _not_a_registry(path: Path) -> FailedPrecondition:
    return FailedPrecondition(
        f"{path} is not a Lake registry: is --data-dir the data directory of `lake meta`?"
    )


class DynamoRoots(RootsSource):
    """The cloud registry table (``LAKE_DYNAMODB_TABLE``): strongly consistent Queries."""

    def __init__(self, table: str, client: Any) -> None:
        self.table = table
        self._client = client

    def _family(self, pk: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": pk}},
            "ConsistentRead": True,
        }
        while True:
            try:
                reply = self._client.query(**kwargs)
            except Exception as exc:
                raise _dynamo_error(exc, self.table) from None
            items.extend(_decode(item) for item in reply.get("Items", []))
            start = reply.get("LastEvaluatedKey")
            if not start:
                return items
            kwargs["ExclusiveStartKey"] = start

    def _meta(self) -> tuple[str, int]:
        marker: dict[str, Any] | None = None
        counter = 0
        for item in self._family("meta#0"):
            if item["sk"] == "authority":
                marker = item
            elif item["sk"] == "generation":
                counter = int(item["n"])
        if marker is None or not marker.get("registry_id"):
            raise FailedPrecondition(
                f"registry table {self.table} has no authority marker; GC fails closed"
            )
        return str(marker["registry_id"]), counter

    def read(self) -> RegistryRoots:
        # Heads between two generation reads that agree: nothing moved in between
        # (and a head that moved without its generation bump differs by itself).
        for _ in range(5):
            registry_id, before = self._meta()
            heads = [item for shard in range(DIR_SHARDS) for item in self._family(f"dir#{shard}")]
            dropped = sorted(str(item["sk"]) for item in self._family("dropped#0"))
            _, after = self._meta()
            if before == after:
                break
        else:
            raise FailedPrecondition("the registry kept changing while GC read it; retry")
        tables = sorted(
            (
                TableRoot(
                    table=f"{h['ns']}.{h['name']}",
                    incarnation=str(h["inc"]),
                    version=int(h["ver"]),
                    engine_version=int(h["ever"]),
                )
                for h in heads
            ),
            key=lambda t: t.table,
        )
        return RegistryRoots(
            registry=f"dynamodb:{self.table}",
            generation=f"{registry_id}:{after}",
            tables=tables,
            dropped=dropped,
        )


def _decode(item: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, typed in item.items():
        ((kind, raw),) = typed.items()
        values[name] = int(raw) if kind == "N" else raw
    return values


def _dynamo_error(exc: BaseException, table: str) -> Exception:
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            return FailedPrecondition(f"registry table {table} does not exist")
        return Unavailable(f"DynamoDB refused a read of {table} ({code}); retry")
    if isinstance(exc, BotoCoreError | OSError):
        return Unavailable(f"DynamoDB is unreachable for {table}; retry")
    return exc if isinstance(exc, Exception) else Unavailable(str(exc))
