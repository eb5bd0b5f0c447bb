"""A silent object store fails an Iceberg scan typed and in bounded time; the replica lives on.

A real ``lake query`` (one admission slot, so a leaked permit would refuse
the next query) reads a pyiceberg table's objects through an S3 proxy
(tools/lake_testing/s3proxy.py) that accepts connections and then never
answers (``stall``), or sends headers and a few bytes and then nothing
(``stall_body``). ``LAKE_ICEBERG_S3_TIMEOUT_MS`` is one second here:

- data files stalled under the plug-in's direct reader: Unavailable
  (retryable) within a few seconds;
- manifests stalled while a DoGet plans its files: Unavailable too;
- data files stalled under iceberg-rust's scan (a DataFusion statement),
  whose reader keeps its own fixed I/O timeout: the execution deadline ends
  the query with DEADLINE_EXCEEDED;

and after each, with storage answering again, the next query succeeds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import lake_sdk
from lake_core.errors import DeadlineExceeded, Unavailable
from tools.lake_testing.iceberg import SeaweedIceberg, proxied_query, write_episodes
from tools.lake_testing.s3proxy import S3Proxy
from tools.lake_testing.servers import LakeProcess

pytestmark = [pytest.mark.iceberg, pytest.mark.s3, pytest.mark.slow]

NAMESPACE = "stalls"
TIMEOUT_MS = 1000
#: The execution deadline: far above a healthy query of these tables, far below
#: iceberg-rust's own stall bound (about 10 s per attempt, four attempts).
EXECUTION_TIMEOUT_MS = 8000
DIRECT = "SELECT episode_id, robot_id, reward FROM iceberg.stalls.{table}"
DATAFUSION = "SELECT robot_id, count(*) AS n FROM iceberg.stalls.{table} GROUP BY robot_id"


@dataclass
class Stalling:
    server: SeaweedIceberg
    proxy: S3Proxy
    query: LakeProcess

    def fails_within(self, sql: str, error: type[Exception], bound_s: float) -> Exception:
        start = time.monotonic()
        with lake_sdk.Client(self.query.url) as sdk, pytest.raises(error) as caught:
            sdk.query_table(sql)
        elapsed = time.monotonic() - start
        assert elapsed < bound_s, (elapsed, caught.value)
        return caught.value

    def serves(self, sql: str) -> None:
        """With storage answering again, the same query runs (its permit came back)."""
        self.proxy.fault = self.proxy.fault_paths = None
        with lake_sdk.Client(self.query.url) as sdk:
            assert sdk.query_table(sql).num_rows > 0


@pytest.fixture(scope="module")
def stalling(
    iceberg_server: SeaweedIceberg, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stalling]:
    root = tmp_path_factory.mktemp("federation-stalls")
    iceberg_server.catalog().create_namespace(NAMESPACE)
    env = {
        "LAKE_ICEBERG_S3_TIMEOUT_MS": str(TIMEOUT_MS),
        "LAKE_QUERY_MAX_CONCURRENT": "1",  # a permit kept by a stalled scan refuses the next
        "LAKE_QUERY_EXECUTION_TIMEOUT_MS": str(EXECUTION_TIMEOUT_MS),
    }
    with proxied_query(iceberg_server, NAMESPACE, root, env) as (proxy, query):
        yield Stalling(iceberg_server, proxy, query)


@pytest.mark.parametrize("fault", ["stall", "stall_body"])
def test_stalled_data_files_fail_a_direct_scan_unavailable(stalling: Stalling, fault: str) -> None:
    table = f"direct_{fault}"
    write_episodes(stalling.server.catalog(), NAMESPACE, table)
    sql = DIRECT.format(table=table)
    stalling.proxy.fault, stalling.proxy.fault_paths = fault, ".parquet"
    before = stalling.proxy.stalled
    try:
        error = stalling.fails_within(sql, Unavailable, bound_s=6.0)
        assert error.retryable
        assert f"iceberg.{NAMESPACE}.{table}" in str(error)
        assert stalling.proxy.stalled > before  # the store really went silent
    finally:
        stalling.serves(sql)


def test_stalled_manifests_fail_a_doget_unavailable(stalling: Stalling) -> None:
    write_episodes(stalling.server.catalog(), NAMESPACE, "manifests")
    sql = DIRECT.format(table="manifests")
    stalling.proxy.fault, stalling.proxy.fault_paths = "stall", ".avro"
    try:
        error = stalling.fails_within(sql, Unavailable, bound_s=EXECUTION_TIMEOUT_MS / 1000)
        assert error.retryable
    finally:
        stalling.serves(sql)


def test_stalled_data_files_under_iceberg_rust_end_at_the_deadline(stalling: Stalling) -> None:
    write_episodes(stalling.server.catalog(), NAMESPACE, "rust")
    sql = DATAFUSION.format(table="rust")
    stalling.proxy.fault, stalling.proxy.fault_paths = "stall_body", ".parquet"
    try:
        stalling.fails_within(sql, DeadlineExceeded, bound_s=EXECUTION_TIMEOUT_MS / 1000 + 4)
    finally:
        stalling.serves(sql)
