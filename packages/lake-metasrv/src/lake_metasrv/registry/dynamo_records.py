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
from lake_metasrv.registry.base import OperationRecord, TableRecord
from lake_metasrv.registry.dynamo_layout import dir_key, op_key, ver_key
from lake_metasrv.registry.dynamo_table import DynamoTable

__all__ = [
    "Owed",
    "operation_record",
    "resolve_pending",
    "write_committed",
    "write_version",
    "write_version_of",
]


@dataclass(frozen=True)
class Owed:
    """Records a moved head still needs: its version record and operation record."""

    record: TableRecord
    operation_id: str | None
    operation_time_ms: int
    committed_at_ms: int
    #: False for a maintenance commit: the version record is owed, the
    #: operation record (written by the append itself) is not.
    operation_owed: bool = True


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
    """Whether a pending operation reached the visibility point (see the registry's docstring)."""
    operation_id, incarnation, version = pending["sk"], pending["inc"], pending["ver"]
    found = await db.get(ver_key(incarnation, version))
    if found is not None:
        if found.get("op") != operation_id:
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
        if head.get("last_op") != operation_id:
            return None
        engine_version, at, location, engine = (
            head["ever"],
            head["last_at"],
            head["loc"],
            head["eng"],
        )
    record = operation_record(
        {**pending, "ever": engine_version, "at": at, "loc": location, "eng": engine}
    )
    with contextlib.suppress(Exception):
        await write_version_of(db, record)
        await write_committed(db, record)
    return record


async def write_version(
    db: DynamoTable, record: TableRecord, operation_id: str | None, at: int
) -> None:
    values = {
        "ever": record.engine_version,
        "at": at,
        "op": operation_id or None,
        "ns": record.table.namespace,
        "name": record.table.name,
        "loc": record.location,
        "eng": record.engine,
    }
    await db.put(values, ver_key(record.incarnation, record.version))


async def write_version_of(db: DynamoTable, op: OperationRecord) -> None:
    values = {
        "ever": op.engine_version,
        "at": op.committed_at_ms,
        "op": op.operation_id,
        "ns": op.table.namespace,
        "name": op.table.name,
        "loc": op.location,
        "eng": op.engine,
    }
    await db.put(values, ver_key(op.incarnation, op.version))


async def write_committed(db: DynamoTable, op: OperationRecord) -> None:
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
    await db.put(values, op_key(op.operation_id))
