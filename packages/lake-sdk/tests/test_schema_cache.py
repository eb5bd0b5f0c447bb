"""The client schema cache: TTL, LRU capacity, single flight, bounds."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from lake_core.errors import InvalidArgument, NotFound
from lake_core.names import TableRef
from lake_sdk._schema_cache import SchemaCache

SCHEMA = pa.schema([("a", pa.int64())])


@pytest.mark.asyncio
async def test_single_flight_and_only_successes_are_stored() -> None:
    cache = SchemaCache()
    calls = 0

    async def load() -> pa.Schema:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return SCHEMA

    table = TableRef("n", "t")
    results = await asyncio.gather(*(cache.get(table, load) for _ in range(20)))
    assert calls == 1
    assert all(r is SCHEMA for r in results)

    async def fail() -> pa.Schema:
        raise NotFound("gone")

    other = TableRef("n", "u")
    for _ in range(2):
        with pytest.raises(NotFound):
            await cache.get(other, fail)
    assert cache.peek(other) is None


@pytest.mark.asyncio
async def test_ttl_capacity_and_invalidation() -> None:
    now = [0.0]
    cache = SchemaCache(capacity=2, ttl_s=10, clock=lambda: now[0])

    async def load() -> pa.Schema:
        return SCHEMA

    a, b, c = (TableRef("n", x) for x in "abc")
    for table in (a, b, c):
        await cache.get(table, load)
    assert cache.peek(a) is None  # least recently used, evicted
    assert cache.peek(c) is SCHEMA
    now[0] = 10.0
    assert cache.peek(c) is None  # expired
    await cache.get(c, load)
    cache.invalidate(c)
    assert cache.peek(c) is None
    await cache.get(b, load)
    cache.clear()
    assert len(cache) == 0


def test_bounds() -> None:
    SchemaCache(65_536, 3600)
    for capacity, ttl in ((0, 60), (65_537, 60), (10, 0), (10, 3601), (True, 60)):
        with pytest.raises(InvalidArgument):
            SchemaCache(capacity, ttl)
