"""A client used after ``close()`` or built from a malformed URL: typed lake_sdk errors.

Against a real ``lake meta`` and ``lake query``. Use after close is the
caller's state (FailedPrecondition), not a bad argument; a URL pyarrow cannot
parse is InvalidArgument, not a raw ``pyarrow.lib.ArrowInvalid``. A refused
append leaves the table as it was (checked through a fresh client).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

import lake_sdk
from lake_sdk.errors import FailedPrecondition, InvalidAppend, InvalidArgument
from tools.lake_testing.plugin import LakeCluster, cluster_env

RUNS = pa.schema([("run_id", pa.int64()), ("robot", pa.utf8())])
ROWS = pa.table({"run_id": [1], "robot": ["r1"]}, schema=RUNS)
INSERT = "INSERT INTO misuse.runs (run_id, robot) VALUES (?, ?)"
#: A well-formed handle: a closed client must refuse it before asking anyone about it.
HANDLE = lake_sdk.JobHandle(capability=b"c" * 32, expires_at=time.time() + 3600)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeCluster]:
    root = tmp_path_factory.mktemp("client-misuse")
    lake_cluster = LakeCluster.start(root, cluster_env(root))
    try:
        with lake_sdk.Client(lake_cluster.query.url) as client:
            client.create_table("misuse.runs", RUNS)
        yield lake_cluster
    finally:
        lake_cluster.stop()


CALLS: dict[str, Callable[[lake_sdk.Client], Any]] = {
    "query_table": lambda c: c.query_table("SELECT 1 AS x"),
    "scan": lambda c: list(c.scan("SELECT 1 AS x")),
    "list_tables": lambda c: c.list_tables(),
    "append_batches": lambda c: c.append_batches("misuse.runs", ROWS.to_batches()),
    "ingest": lambda c: c.ingest("misuse.runs", ROWS),
    "insert": lambda c: c.insert(INSERT, [2, "r2"]),
    # Durable jobs poll over their own gRPC channel, which close() must not let reopen.
    "jobs.submit": lambda c: c.jobs.submit("SELECT 1 AS x"),
    "jobs.query": lambda c: c.jobs.query("SELECT 1 AS x"),
    "jobs.poll": lambda c: c.jobs.poll(HANDLE),
    "jobs.wait": lambda c: c.jobs.wait(HANDLE),
    "jobs.resume": lambda c: c.jobs.resume(HANDLE),
    "jobs.cancel": lambda c: c.jobs.cancel(HANDLE),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_closed_client_refuses_every_call_as_failed_precondition(
    cluster: LakeCluster, call: str
) -> None:
    client = lake_sdk.Client(cluster.query.url)
    client.close()
    with pytest.raises(FailedPrecondition, match="is closed"):
        CALLS[call](client)
    with lake_sdk.Client(cluster.query.url) as fresh:
        assert fresh.query_table("SELECT count(*) AS n FROM misuse.runs")["n"][0].as_py() == 0


def test_a_closed_async_client_refuses_job_calls(cluster: LakeCluster) -> None:
    """The async client's jobs share the sync client's channel logic: refused after close()."""

    async def after_close() -> None:
        client = lake_sdk.AsyncClient(cluster.query.url)
        await client.close()
        with pytest.raises(FailedPrecondition, match="is closed"):
            await client.jobs.submit("SELECT 1 AS x")
        with pytest.raises(FailedPrecondition, match="is closed"):
            await client.jobs.poll(HANDLE)

    asyncio.run(after_close())


@pytest.mark.parametrize("url", ["grpc://127.0.0.1:1:2", "http://x:y:z"])
def test_a_malformed_url_is_invalid_argument(url: str) -> None:
    with pytest.raises(InvalidArgument, match="not a valid address"):
        lake_sdk.Client(url)


@pytest.mark.parametrize("batches", [None, 5, "abc", ROWS.to_batches()[0]])
def test_append_batches_refuses_what_is_not_batches_by_name(
    cluster: LakeCluster, batches: Any
) -> None:
    """None or an int was a bare TypeError; a lone RecordBatch blamed its first column."""
    with lake_sdk.Client(cluster.query.url) as client:
        with pytest.raises(InvalidAppend, match="iterable of pyarrow"):
            client.append_batches("misuse.runs", batches)
        assert client.query_table("SELECT count(*) AS n FROM misuse.runs")["n"][0].as_py() == 0
