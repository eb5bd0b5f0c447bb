"""Submit, poll, resume and cancel durable async queries across replicas."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa

import lake_sdk
from tests.async_queries.conftest import SQL, AsyncLake


def _wait_done(sdk: lake_sdk.Client, handle: lake_sdk.AsyncQueryHandle) -> lake_sdk.AsyncQueryHandle:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        handle = sdk.poll_async(handle)
        if handle.state in ("done", "failed", "cancelled"):
            return handle
        time.sleep(0.05)
    raise AssertionError(f"job still {handle.state}")


def test_query_async_streams_the_same_rows_as_an_interactive_query(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    loaded(3000)
    replica = async_lake.queries[0]
    with lake_sdk.Client(replica.url) as sdk:
        interactive = sdk.query_table(SQL)
        durable = sdk.query_async(SQL).to_table()
    assert durable.num_rows == 3000
    assert durable.equals(interactive)
