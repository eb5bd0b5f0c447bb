"""The async state store on DynamoDB (S3 mode): one table, single-item conditional writes.

Layout as the registry's: partition key ``<family>#<shard>``, sort key the
document key, so a family's page is a strongly consistent Query per shard.
Each item holds the document (JSON) and its revision; a write names the
revision it replaces (``attribute_not_exists`` for a new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from typing import Any

import aioboto3

from lake_core.errors import Unavailable
from lake_query.jobs.store import Document, StateStore, check_address

__all__ = ["SHARDS", "DynamoStateStore"]

#: Shards per family: spreads the active-job index over partitions.
SHARDS = 4

_SCHEMA = {
    "AttributeDefinitions": [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "S"},
    ],
    "KeySchema": [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ],
}


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _key(family: str, key: str) -> dict[str, Any]:
    check_address(family, key)
    shard = zlib.crc32(key.encode()) % SHARDS
    return {"pk": {"S": f"{family}#{shard}"}, "sk": {"S": key}}


class DynamoStateStore(StateStore):
    """Async job state in one DynamoDB table (created when missing)."""

    def __init__(self, table: str, *, endpoint_url: str | None, region: str | None) -> None:
        self.table = table
        self._endpoint_url = endpoint_url
        self._region = region
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    def __repr__(self) -> str:
        return f"DynamoStateStore({self.table!r})"

    async def open(self) -> DynamoStateStore:
        from botocore.config import Config

        config = Config(
            connect_timeout=2,
            read_timeout=5,
            retries={"total_max_attempts": 3, "mode": "standard"},
            max_pool_connections=32,
        )
        self._client = await self._stack.enter_async_context(
            aioboto3.Session().client(
                "dynamodb",
                endpoint_url=self._endpoint_url,
                region_name=self._region,
                config=config,
            )
        )
        await self._ensure_table()
        return self

    async def _ensure_table(self) -> None:
        try:
            reply = await self._client.describe_table(TableName=self.table)
        except Exception as exc:
            if _code(exc) != "ResourceNotFoundException":
                raise Unavailable(f"async state table {self.table} is not reachable") from None
            with contextlib.suppress(Exception):
                await self._client.create_table(
                    TableName=self.table, BillingMode="PAY_PER_REQUEST", **_SCHEMA
                )
            reply = await self._client.describe_table(TableName=self.table)
        deadline = time.monotonic() + 60
        while reply["Table"]["TableStatus"] != "ACTIVE":
            if time.monotonic() > deadline:
                raise Unavailable(f"async state table {self.table} did not become ACTIVE")
            await asyncio.sleep(0.2)
            reply = await self._client.describe_table(TableName=self.table)

    async def close(self) -> None:
        await self._stack.aclose()

    async def read(self, family: str, key: str) -> Document | None:
        try:
            reply = await self._client.get_item(
                TableName=self.table, Key=_key(family, key), ConsistentRead=True
            )
        except Exception:
            raise Unavailable("the async state store did not answer") from None
        item = reply.get("Item")
        if item is None:
            return None
        return json.loads(item["doc"]["S"]), int(item["rev"]["N"])

    async def write(self, family: str, key: str, doc: dict[str, Any], expect: int | None) -> bool:
        item = {
            **_key(family, key),
            "doc": {"S": json.dumps(doc, separators=(",", ":"))},
            "rev": {"N": str((expect or 0) + 1)},
        }
        condition: dict[str, Any]
        if expect is None:
            condition = {"ConditionExpression": "attribute_not_exists(pk)"}
        else:
            condition = {
                "ConditionExpression": "rev = :r",
                "ExpressionAttributeValues": {":r": {"N": str(expect)}},
            }
        try:
            await self._client.put_item(TableName=self.table, Item=item, **condition)
        except Exception as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return False
            raise Unavailable("the async state store did not answer") from None
        return True

    async def remove(self, family: str, key: str, expect: int | None = None) -> bool:
        condition: dict[str, Any] = {"ConditionExpression": "attribute_exists(pk)"}
        if expect is not None:
            condition = {
                "ConditionExpression": "rev = :r",
                "ExpressionAttributeValues": {":r": {"N": str(expect)}},
            }
        try:
            await self._client.delete_item(TableName=self.table, Key=_key(family, key), **condition)
        except Exception as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return False
            raise Unavailable("the async state store did not answer") from None
        return True

    async def keys(self, family: str, after: str | None, limit: int) -> list[str]:
        found: list[str] = []
        for shard in range(SHARDS):
            request: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": "pk = :p" + (" AND sk > :a" if after else ""),
                "ExpressionAttributeValues": {":p": {"S": f"{family}#{shard}"}},
                "ProjectionExpression": "sk",
                "ConsistentRead": True,
                "Limit": limit,
            }
            if after:
                request["ExpressionAttributeValues"][":a"] = {"S": after}
            try:
                reply = await self._client.query(**request)
            except Exception:
                raise Unavailable("the async state store did not answer") from None
            found += [item["sk"]["S"] for item in reply.get("Items", [])]
        return sorted(found)[:limit]
