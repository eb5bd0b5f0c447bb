"""Table schemas for client-side validation, cached and shared by client clones.

Defaults: 1,024 tables for 60 seconds; capacity is capped at 65,536 and the
TTL at one hour. Concurrent misses for one table share a single lookup
(single flight), and only successful lookups are stored. Expiry bounds how
long a dropped-and-recreated table's old schema can be used locally;
:meth:`SchemaCache.invalidate` and :meth:`SchemaCache.clear` refresh at once.
Metasrv still validates every append, so the cache is an optimisation only.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_core.names import TableRef

__all__ = [
    "DEFAULT_SCHEMA_CACHE_CAPACITY",
    "DEFAULT_SCHEMA_CACHE_TTL_S",
    "MAX_SCHEMA_CACHE_CAPACITY",
    "MAX_SCHEMA_CACHE_TTL_S",
    "SchemaCache",
]

DEFAULT_SCHEMA_CACHE_CAPACITY = 1024
DEFAULT_SCHEMA_CACHE_TTL_S = 60.0
MAX_SCHEMA_CACHE_CAPACITY = 65_536
MAX_SCHEMA_CACHE_TTL_S = 3600.0


class SchemaCache:
    """An LRU of table schemas with a TTL and single-flight misses."""

    def __init__(
        self,
        capacity: int = DEFAULT_SCHEMA_CACHE_CAPACITY,
        ttl_s: float = DEFAULT_SCHEMA_CACHE_TTL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise InvalidArgument("schema cache capacity must be an integer")
        if not 1 <= capacity <= MAX_SCHEMA_CACHE_CAPACITY:
            raise InvalidArgument(
                f"schema cache capacity must be in 1..={MAX_SCHEMA_CACHE_CAPACITY}, got {capacity}"
            )
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
            raise InvalidArgument("schema cache TTL must be a number of seconds")
        if not 0 < ttl_s <= MAX_SCHEMA_CACHE_TTL_S:
            raise InvalidArgument(
                f"schema cache TTL must be in (0, {MAX_SCHEMA_CACHE_TTL_S:g}] seconds, got {ttl_s}"
            )
        self.capacity = capacity
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._entries: OrderedDict[TableRef, tuple[float, pa.Schema]] = OrderedDict()
        self._inflight: dict[TableRef, asyncio.Future[pa.Schema]] = {}
        self.lookups = 0

    def __repr__(self) -> str:
        return f"SchemaCache({len(self._entries)}/{self.capacity}, ttl={self.ttl_s:g}s)"

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, table: TableRef) -> pa.Schema | None:
        """The cached, unexpired schema without loading."""
        found = self._entries.get(table)
        if found is None:
            return None
        if self._clock() >= found[0]:
            del self._entries[table]
            return None
        self._entries.move_to_end(table)
        return found[1]

    async def get(self, table: TableRef, load: Callable[[], Awaitable[pa.Schema]]) -> pa.Schema:
        """The schema of ``table``, loading it (once for all concurrent callers) on a miss."""
        cached = self.peek(table)
        if cached is not None:
            return cached
        pending = self._inflight.get(table)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[pa.Schema] = asyncio.get_running_loop().create_future()
        self._inflight[table] = future
        try:
            self.lookups += 1
            schema = await load()
        except BaseException as exc:
            if future.done():
                pass
            elif isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # consumed: waiters re-raise it, no "never retrieved" warning
            raise
        finally:
            self._inflight.pop(table, None)
        future.set_result(schema)
        self._store(table, schema)
        return schema

    def _store(self, table: TableRef, schema: pa.Schema) -> None:
        self._entries[table] = (self._clock() + self.ttl_s, schema)
        self._entries.move_to_end(table)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def invalidate(self, table: TableRef) -> None:
        self._entries.pop(table, None)

    def clear(self) -> None:
        self._entries.clear()
