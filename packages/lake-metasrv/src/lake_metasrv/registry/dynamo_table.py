"""The cloud registry's DynamoDB table: its client and the single-item calls on it.

:class:`~lake_metasrv.registry.dynamo.DynamoRegistry` builds the registry
protocol from these calls; the key layout and the item codec are in
:mod:`lake_metasrv.registry.dynamo_layout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from lake_core.errors import Internal, Unavailable
from lake_metasrv.registry.dynamo_layout import (
    DIR_SHARDS,
    LAYOUT_VERSION,
    META,
    PAGE_SIZE,
    REGISTRY_SCHEMA,
    Item,
    decode,
    dynamo_client_config,
    encode,
    ensure_table,
    error_code,
    item_key,
    s_attr,
)

__all__ = ["BATCH_GET_KEYS", "BATCH_WRITE_ITEMS", "DynamoTable"]

log = structlog.get_logger("lake_metasrv.registry.dynamo")

#: DynamoDB's bound on the keys of one BatchGetItem.
BATCH_GET_KEYS = 100
#: DynamoDB's bound on the puts of one BatchWriteItem.
BATCH_WRITE_ITEMS = 25
#: Rounds of re-asking for keys DynamoDB left unprocessed before giving up.
BATCH_GET_ROUNDS = 8


class DynamoTable:
    """One DynamoDB table, opened with its own client or sharing an open one.

    ``client`` is an open aiobotocore DynamoDB client (shared with the lease);
    without one, :meth:`open` creates its own from ``endpoint_url``/``region``.
    ``provision`` creates the table when it is missing.
    """

    def __init__(
        self,
        table: str,
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        provision: bool = True,
    ) -> None:
        self.table = table
        self.client: Any = client
        self._endpoint_url = endpoint_url
        self._region = region
        self._provision = provision
        self._stack: contextlib.AsyncExitStack | None = None

    async def call(self, method: str, **kwargs: Any) -> Any:
        if self.client is None:
            raise Internal(f"registry {self.table} is not open")
        return await getattr(self.client, method)(TableName=self.table, **kwargs)

    async def read(self, method: str, **kwargs: Any) -> Any:
        """A read: any failure is UNAVAILABLE (retryable), never an internal error."""
        try:
            return await self.call(method, **kwargs)
        except Exception as exc:
            raise self.unavailable(exc) from None

    async def get(self, key: Item) -> dict[str, Any] | None:
        reply = await self.read("get_item", Key=key, ConsistentRead=True)
        item = reply.get("Item")
        return None if item is None else decode(item)

    async def get_many(self, keys: Sequence[Item]) -> list[dict[str, Any]]:
        """The items that exist among ``keys``, strongly consistent, in any order.

        One BatchGetItem per :data:`BATCH_GET_KEYS` keys instead of one
        GetItem each; keys DynamoDB leaves unprocessed (throttling) are asked
        again, and still missing after :data:`BATCH_GET_ROUNDS` rounds are
        UNAVAILABLE, never reported absent.
        """
        found: list[dict[str, Any]] = []
        for start in range(0, len(keys), BATCH_GET_KEYS):
            request: Item = {
                self.table: {
                    "Keys": list(keys[start : start + BATCH_GET_KEYS]),
                    "ConsistentRead": True,
                }
            }
            for attempt in range(BATCH_GET_ROUNDS):
                if self.client is None:
                    raise Internal(f"registry {self.table} is not open")
                try:
                    reply = await self.client.batch_get_item(RequestItems=request)
                except Exception as exc:
                    raise self.unavailable(exc) from None
                found.extend(
                    decode(item) for item in reply.get("Responses", {}).get(self.table, [])
                )
                request = reply.get("UnprocessedKeys") or {}
                if not request.get(self.table, {}).get("Keys"):
                    break
                await asyncio.sleep(0.01 * 2**attempt)
            else:
                raise Unavailable(
                    f"registry table {self.table} kept throttling a batch read; retry"
                )
        return found

    async def query(
        self, pk: str, *, below: str | None = None, limit: int = PAGE_SIZE
    ) -> AsyncIterator[dict[str, Any]]:
        """Every item of one family (strongly consistent), ``limit`` per page."""
        condition = "pk = :pk" + (" AND sk < :below" if below is not None else "")
        values: Item = {":pk": s_attr(pk)}
        if below is not None:
            values[":below"] = s_attr(below)
        start: Item | None = None
        while True:
            kwargs: dict[str, Any] = {
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "ConsistentRead": True,
                "Limit": limit,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            reply = await self.read("query", **kwargs)
            for item in reply.get("Items", []):
                yield decode(item)
            start = reply.get("LastEvaluatedKey")
            if not start:
                return

    async def put(self, values: dict[str, Any], key: Item, **kwargs: Any) -> None:
        await self.call("put_item", Item={**key, **encode(values)}, **kwargs)

    async def put_many(self, items: Sequence[Item]) -> None:
        """Unconditional puts of whole items (distinct keys), :data:`BATCH_WRITE_ITEMS` a request.

        One BatchWriteItem instead of one PutItem each; items DynamoDB leaves
        unprocessed (throttling) are sent again, and still unwritten after
        :data:`BATCH_GET_ROUNDS` rounds are UNAVAILABLE. Each item lands or
        not on its own (no transaction): only for records that are
        repairable, written past a visibility point.
        """
        await asyncio.gather(
            *(
                self._put_batch(items[start : start + BATCH_WRITE_ITEMS])
                for start in range(0, len(items), BATCH_WRITE_ITEMS)
            )
        )

    async def _put_batch(self, items: Sequence[Item]) -> None:
        writes = [{"PutRequest": {"Item": item}} for item in items]
        for attempt in range(BATCH_GET_ROUNDS):
            if self.client is None:
                raise Internal(f"registry {self.table} is not open")
            reply = await self.client.batch_write_item(RequestItems={self.table: writes})
            writes = (reply.get("UnprocessedItems") or {}).get(self.table) or []
            if not writes:
                return
            await asyncio.sleep(0.01 * 2**attempt)
        raise Unavailable(f"registry table {self.table} kept throttling a batch write; retry")

    async def open(self) -> None:
        if self._stack is not None:
            return
        self._stack = contextlib.AsyncExitStack()
        try:
            if self.client is None:
                import aioboto3

                session = aioboto3.Session()
                self.client = await self._stack.enter_async_context(
                    session.client(
                        "dynamodb",
                        endpoint_url=self._endpoint_url,
                        region_name=self._region,
                        config=dynamo_client_config(),
                    )
                )
            if self._provision:
                await ensure_table(self.client, self.table, **REGISTRY_SCHEMA)
        except BaseException:
            await self.close()
            raise

    async def bootstrap(self) -> str | None:
        """The registry id, writing the authority marker into an empty table.

        None when the directory has heads but no marker: not an authority
        this process may vouch for, so catalog snapshots fail closed.
        """
        marker = await self.get(item_key(META, "authority"))
        if marker is None:
            if not await self._directory_empty():
                # A non-empty directory without its marker is not an authority
                # this process may vouch for: snapshots fail closed.
                log.error("registry authority marker missing", table=self.table)
                return None
            fresh = {"registry_id": str(uuid.uuid4()), "layout": LAYOUT_VERSION, "epoch": 0}
            with contextlib.suppress(Exception):
                await self.put(
                    fresh,
                    item_key(META, "authority"),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            with contextlib.suppress(Exception):
                await self.put(
                    {"n": 0},
                    item_key(META, "generation"),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            marker = await self.get(item_key(META, "authority"))
            if marker is None:
                raise Unavailable(f"cannot initialize registry table {self.table}")
        if marker.get("layout") != LAYOUT_VERSION:
            raise Internal(
                f"registry {self.table} has layout {marker.get('layout')}, "
                f"this Metasrv reads layout {LAYOUT_VERSION}"
            )
        return str(marker["registry_id"])

    async def _directory_empty(self) -> bool:
        for shard in range(DIR_SHARDS):
            reply = await self.read(
                "query",
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": s_attr(f"dir#{shard}")},
                ConsistentRead=True,
                Limit=1,
            )
            if reply.get("Items"):
                return False
        return True

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
            self.client = None

    def unavailable(self, exc: BaseException) -> Unavailable:
        """A failed call as the retryable error callers see (the DynamoDB code, never secrets)."""
        reason = error_code(exc) or type(exc).__name__
        return Unavailable(f"registry table {self.table} unavailable ({reason}); retry")
