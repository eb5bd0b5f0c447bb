"""The blocking facade: the async client driven on a private event loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import pyarrow as pa

from lake_core.names import TableRef
from lake_sdk.client import LakeClient

__all__ = ["Client", "connect"]

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="lake-sdk", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Client:
    """A blocking Lake client; see :class:`lake_sdk.LakeClient` for the async one."""

    def __init__(self, runner: _LoopThread, inner: LakeClient) -> None:
        self._runner = runner
        self._inner = inner

    def __repr__(self) -> str:
        return f"Client({self._inner.url!r})"

    def query(self, sql: str) -> Iterator[pa.RecordBatch]:
        result = self._runner.run(self._inner.query(sql))
        stream = result.__aiter__()
        while True:
            try:
                yield self._runner.run(_next(stream))
            except StopAsyncIteration:
                return

    def query_table(self, sql: str) -> pa.Table:
        return self._runner.run(self._inner.query_table(sql))

    def table_schema(self, table: TableRef | str) -> pa.Schema:
        return self._runner.run(self._inner.table_schema(table))

    def append_batches(
        self,
        table: TableRef | str,
        batches: Iterable[pa.RecordBatch] | pa.Table,
        *,
        operation_id: str | None = None,
    ) -> int:
        return self._runner.run(
            self._inner.append_batches(table, batches, operation_id=operation_id)
        )

    def close(self) -> None:
        try:
            self._runner.run(self._inner.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


async def _next(stream: Any) -> pa.RecordBatch:
    batch: pa.RecordBatch = await stream.__anext__()
    return batch


def connect(url: str, **kwargs: Any) -> Client:
    """Connect to a Lake Query endpoint and return a blocking client."""
    runner = _LoopThread()
    try:
        inner = runner.run(LakeClient.connect(url, **kwargs))
    except BaseException:
        runner.stop()
        raise
    return Client(runner, inner)
