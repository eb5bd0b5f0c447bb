"""The cloud registry's version and operation records: how they are written and resolved.

A head that moved owes its version record and its operation record (see
:mod:`lake_metasrv.registry.dynamo`); these write them, and resolve a pending
operation record from what the head or the version record says.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast

from lake_core.models import Engine
from lake_core.names import TableRef
from lake_metasrv.registry.base import (
    AppendOperation,
    OperationRecord,
    TableRecord,
    split_operation_ids,
)
from lake_metasrv.registry.dynamo_layout import Item, dir_key, encode, op_key, ver_key
from lake_metasrv.registry.dynamo_table import DynamoTable

__all__ = [
    "Owed",
    "committed_item",
    "operation_record",
    "resolve_pending",
    "version_item",
    "write_committed",
    "write_version",
    "write_version_of",
]


@dataclass(frozen=True)
class Owed:
    """Records a moved head still needs: its version record and its operation records."""

    record: TableRecord
    #: The version's operation ids in their stored form (the head's ``last_op``).
    stored_ops: str | None
    committed_at_ms: int
    #: The operation records owed (every append of the group); empty for a
    #: maintenance commit, whose version's appends were recorded by their commit.
    operations: tuple[AppendOperation, ...] = ()

    def committed(self) -> list[OperationRecord]:
        return [
            OperationRecord(
                operation_id=op.operation_id,
                table=self.record.table,
                incarnation=self.record.incarnation,
                location=self.record.location,
                engine=self.record.engine,
                version=self.record.version,
                engine_version=self.record.engine_version,
                operation_time_ms=op.operation_time_ms,
                committed_at_ms=self.committed_at_ms,
            )
            for op in self.operations
        ]


def operation_record(values: dict[str, Any]) -> OperationRecord:
    return OperationRecord(
        operation_id=values["sk"],
        table=TableRef(values["ns"], values["name"]),
        incarnation=values["inc"],
        location=values["loc"],
        engine=cast(Engine, values["eng"]),
        version=values["ver"],
        engine_version=values["ever"],
        operation_time_ms=values["op_time"],
        committed_at_ms=values["at"],
    )


async def resolve_pending(db: DynamoTable, pending: dict[str, Any]) -> OperationRecord | None:
    """Whether a pending operation reached the visibility point (see the registry's docstring).

    It did exactly when the version record of its intended version, or the
    head while that version is current, names it among the version's appends.
    """
    operation_id, incarnation, version = pending["sk"], pending["inc"], pending["ver"]
    found = await db.get(ver_key(incarnation, version))
    owed_version: str | None = None
    if found is not None:
        if operation_id not in split_operation_ids(found.get("op")):
            return None
        engine_version, at, location, engine = (
            found["ever"],
            found["at"],
            found["loc"],
            found["eng"],
        )
    else:
        # No version record: only the head's current version can lack one.
        head = await db.get(dir_key(TableRef(pending["ns"], pending["name"])))
        if head is None or head["inc"] != incarnation or head["ver"] != version:
            return None
        if operation_id not in split_operation_ids(head.get("last_op")):
            return None
        engine_version, at, location, engine = (
            head["ever"],
            head["last_at"],
            head["loc"],
            head["eng"],
        )
        owed_version = head.get("last_op")
    record = operation_record(
        {**pending, "ever": engine_version, "at": at, "loc": location, "eng": engine}
    )
    with contextlib.suppress(Exception):
        if owed_version is not None:
            await write_version_of(db, record, owed_version)
        await write_committed(db, record)
    return record


def version_item(record: TableRecord, stored_ops: str | None, at: int) -> Item:
    """The version record of ``record``'s version; ``stored_ops``: its appends' ids, joined."""
    values = {
        "ever": record.engine_version,
        "at": at,
        "op": stored_ops or None,
        "ns": record.table.namespace,
        "name": record.table.name,
        "loc": record.location,
        "eng": record.engine,
    }
    return {**ver_key(record.incarnation, record.version), **encode(values)}


async def write_version(
    db: DynamoTable, record: TableRecord, stored_ops: str | None, at: int
) -> None:
    """Put :func:`version_item`."""
    await db.call("put_item", Item=version_item(record, stored_ops, at))


async def write_version_of(db: DynamoTable, op: OperationRecord, stored_ops: str) -> None:
    """The version record ``op`` was committed in (``stored_ops``: every append it holds)."""
    values = {
        "ever": op.engine_version,
        "at": op.committed_at_ms,
        "op": stored_ops,
        "ns": op.table.namespace,
        "name": op.table.name,
        "loc": op.location,
        "eng": op.engine,
    }
    await db.put(values, ver_key(op.incarnation, op.version))


def committed_item(op: OperationRecord) -> Item:
    """The operation record of ``op``, committed."""
    values = {
        "st": "committed",
        "ns": op.table.namespace,
        "name": op.table.name,
        "inc": op.incarnation,
        "loc": op.location,
        "eng": op.engine,
        "ver": op.version,
        "ever": op.engine_version,
        "op_time": op.operation_time_ms,
        "at": op.committed_at_ms,
    }
    return {**op_key(op.operation_id), **encode(values)}


async def write_committed(db: DynamoTable, op: OperationRecord) -> None:
    await db.call("put_item", Item=committed_item(op))
