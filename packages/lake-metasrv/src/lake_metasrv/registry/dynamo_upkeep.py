"""The cloud registry's housekeeping: pruning operation ids, and a new leader's takeover.

Both walk whole key families of the registry table
(:mod:`lake_metasrv.registry.dynamo_layout`) rather than one table's items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from lake_core.ids import operation_time_ms
from lake_core.names import TableRef
from lake_metasrv.registry.dynamo_layout import (
    DIR_SHARDS,
    META,
    OP_SHARDS,
    Item,
    conditional_failed,
    decode,
    dir_key,
    head_record,
    item_key,
    n_attr,
    op_bound,
)
from lake_metasrv.registry.dynamo_records import write_version
from lake_metasrv.registry.dynamo_table import DynamoTable

__all__ = ["Superseded", "fence_every_head", "prune_operations"]


class Superseded(Exception):
    """A leader of a newer epoch already holds the registry (the registry raises NotLeader)."""


async def prune_operations(db: DynamoTable, older_than_ms: int) -> int:
    """Delete operation records whose UUIDv7 time is before ``older_than_ms``; return how many."""
    bound = op_bound(older_than_ms)
    removed = 0
    for shard in range(OP_SHARDS):
        keys = [
            item_key(f"op#{shard}", item["sk"])
            async for item in db.query(f"op#{shard}", below=bound)
            if operation_time_ms(item["sk"]) < older_than_ms
        ]
        removed += await _delete_all(db, keys)
    return removed


async def _delete_all(db: DynamoTable, keys: Iterable[Item]) -> int:
    keys = list(keys)
    for start in range(0, len(keys), 25):
        requests = [{"DeleteRequest": {"Key": k}} for k in keys[start : start + 25]]
        for _ in range(10):
            reply = await db.client.batch_write_item(RequestItems={db.table: requests})
            requests = reply.get("UnprocessedItems", {}).get(db.table, [])
            if not requests:
                break
            await asyncio.sleep(0.05)
    return len(keys)


async def fence_every_head(db: DynamoTable, epoch: int) -> int:
    """Raise the authority epoch to ``epoch``, then stamp every head with it and repair.

    Writes of older epochs then fail; the version record of each head's
    current version is (re)written from the head. Returns the number of
    tables fenced; raises :class:`Superseded` if a newer epoch got there first.
    """
    try:
        await db.call(
            "update_item",
            Key=item_key(META, "authority"),
            UpdateExpression="SET epoch = :epoch",
            ConditionExpression="attribute_exists(pk) AND epoch < :epoch",
            ExpressionAttributeValues={":epoch": n_attr(epoch)},
        )
    except Exception as exc:
        if conditional_failed(exc):
            raise Superseded(f"epoch {epoch} is not newer than the registry's authority") from None
        raise
    fenced = 0
    for shard in range(DIR_SHARDS):
        async for head in db.query(f"dir#{shard}"):
            table = TableRef(head["ns"], head["name"])
            try:
                reply = await db.call(
                    "update_item",
                    Key=dir_key(table),
                    UpdateExpression="SET fence = :epoch",
                    ConditionExpression=(
                        "attribute_exists(pk) AND (attribute_not_exists(fence) OR fence <= :epoch)"
                    ),
                    ExpressionAttributeValues={":epoch": n_attr(epoch)},
                    ReturnValues="ALL_NEW",
                )
            except Exception as exc:
                if not conditional_failed(exc):
                    raise
                if await db.get(dir_key(table)) is None:
                    continue  # dropped meanwhile
                raise Superseded(f"a leader newer than epoch {epoch} fenced {table}") from None
            current = decode(reply["Attributes"])
            await write_version(
                db, head_record(current), current.get("last_op"), current["last_at"]
            )
            fenced += 1
    return fenced
