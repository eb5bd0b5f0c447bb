"""The registry table's key layout and item encoding (no I/O except ``ensure_table``).

Every item is ``(pk = family#shard, sk = full key)``, so each kind of read is
a strongly consistent Query over one family::

    meta#0        authority            registry id, layout, leader epoch (monotonic)
    meta#0        generation           the directory generation counter
    lease#0       metasrv              the leader lease (lake_metasrv.lease)
    dir#<0..3>    <ns>/<table>         the table head: incarnation, location, schema,
                                       version, engine_version, last_op, fence
    ver#<inc>     <version:020d>       one committed Lake version of an incarnation
    op#<0..15>    <operation id>       an append operation: pending, then committed
    dropped#0     <incarnation>        a dropped incarnation (for GC)

Attribute values are DynamoDB's typed JSON (``S``, ``N``, ``B``, ``BOOL``).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any, cast

from lake_core.errors import Unavailable
from lake_core.models import Engine
from lake_core.names import TableRef
from lake_metasrv.registry.base import TableRecord

__all__ = [
    "DIR_SHARDS",
    "DROPPED",
    "LAYOUT_VERSION",
    "META",
    "OP_SHARDS",
    "PAGE_SIZE",
    "REGISTRY_SCHEMA",
    "Item",
    "conditional_failed",
    "decode",
    "dir_key",
    "dynamo_client_config",
    "encode",
    "ensure_table",
    "entry_bytes",
    "error_code",
    "head_record",
    "item_key",
    "n_attr",
    "op_bound",
    "op_key",
    "s_attr",
    "shard_of",
    "ver_key",
]

LAYOUT_VERSION = 1
DIR_SHARDS = 4
OP_SHARDS = 16
#: Catalog and maintenance reads page through this many items at a time.
PAGE_SIZE = 64
META = "meta#0"
DROPPED = "dropped#0"
Item = dict[str, Any]


def dynamo_client_config() -> Any:
    """botocore settings: short timeouts and few retries, so outages surface quickly."""
    from botocore.config import Config

    return Config(
        connect_timeout=2,
        read_timeout=3,
        retries={"total_max_attempts": 3, "mode": "standard"},
        max_pool_connections=64,
    )


def s_attr(value: str) -> dict[str, str]:
    return {"S": value}


def n_attr(value: int) -> dict[str, str]:
    return {"N": str(int(value))}


def item_key(pk: str, sk: str) -> Item:
    return {"pk": s_attr(pk), "sk": s_attr(sk)}


def encode(values: dict[str, Any]) -> Item:
    item: Item = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            item[name] = {"BOOL": value}
        elif isinstance(value, int):
            item[name] = n_attr(value)
        elif isinstance(value, bytes):
            item[name] = {"B": value}
        else:
            item[name] = s_attr(str(value))
    return item


def decode(item: Item) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, typed in item.items():
        ((kind, raw),) = typed.items()
        if kind == "N":
            values[name] = int(raw)
        elif kind == "B":
            values[name] = bytes(raw)
        else:
            values[name] = raw
    return values


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def conditional_failed(exc: BaseException) -> bool:
    return error_code(exc) == "ConditionalCheckFailedException"


def shard_of(text: str, shards: int) -> int:
    return zlib.crc32(text.encode()) % shards


def dir_key(table: TableRef) -> Item:
    name = f"{table.namespace}/{table.name}"
    return item_key(f"dir#{shard_of(name, DIR_SHARDS)}", name)


def op_key(operation_id: str) -> Item:
    return item_key(f"op#{shard_of(operation_id, OP_SHARDS)}", operation_id)


def ver_key(incarnation: str, version: int) -> Item:
    return item_key(f"ver#{incarnation}", f"{version:020d}")


def op_bound(older_than_ms: int) -> str:
    """The smallest UUIDv7 text whose time is ``older_than_ms`` (ids sort by time)."""
    ms = max(0, older_than_ms) & ((1 << 48) - 1)
    return f"{ms >> 16:08x}-{ms & 0xFFFF:04x}"


def head_record(values: dict[str, Any]) -> TableRecord:
    return TableRecord(
        table=TableRef(values["ns"], values["name"]),
        incarnation=values["inc"],
        location=values["loc"],
        engine=cast(Engine, values["eng"]),
        schema_ipc=values["schema"],
        version=values["ver"],
        engine_version=values["ever"],
        created_at_ms=values["created"],
    )


def entry_bytes(values: dict[str, Any]) -> int:
    return sum(len(k) + (len(v) if isinstance(v, bytes | str) else 8) for k, v in values.items())


async def ensure_table(client: Any, name: str, timeout_s: float = 60.0, **schema: Any) -> None:
    """Create a DynamoDB table unless it exists, and wait until it is ACTIVE."""
    try:
        reply = await client.describe_table(TableName=name)
    except Exception as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise
        try:
            await client.create_table(TableName=name, BillingMode="PAY_PER_REQUEST", **schema)
        except Exception as create_exc:
            if error_code(create_exc) != "ResourceInUseException":
                raise
        reply = await client.describe_table(TableName=name)
    deadline = time.monotonic() + timeout_s
    while reply["Table"]["TableStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise Unavailable(f"DynamoDB table {name} did not become ACTIVE")
        await asyncio.sleep(0.2)
        reply = await client.describe_table(TableName=name)


REGISTRY_SCHEMA = {
    "AttributeDefinitions": [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ],
    "KeySchema": [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ],
}
