"""The failure probe is bounded: a few existence checks, one storage timeout, first answer wins.

When a scan fails, the plug-in checks whether the snapshot's data files are
still there to tell DataCorrupted (a file gone) from Unavailable (storage
down or silent). Over a table of many files, through a request-counting S3
proxy (tools/lake_testing/s3proxy.py), in this process:

- every file present: at most PROBE_LIMIT existence requests, then None
  (the scan's own error stands);
- storage answering 503 or not answering at all: Unavailable, still at most
  PROBE_LIMIT files asked, and a silent store costs one timeout, not one per file;
- a file gone among those probed: DataCorrupted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from lake_core.errors import DataCorrupted, Unavailable
from lake_iceberg.federation.scan import PROBE_LIMIT
from tools.lake_testing.iceberg import SeaweedIceberg, in_process_federation
from tools.lake_testing.s3proxy import S3Proxy

pytestmark = [pytest.mark.iceberg, pytest.mark.s3, pytest.mark.slow]

NAMESPACE = "probes"
FILES = 3 * PROBE_LIMIT
TIMEOUT_MS = 1000


@dataclass
class Probing:
    server: SeaweedIceberg
    proxy: S3Proxy
    federation: Any

    def probed(self) -> list[str]:
        """The data files the proxy was asked about with HEAD (existence checks)."""
        return [
            p
            for (method, p), _ in self.proxy.paths.items()
            if method == "HEAD" and p.endswith(".parquet")
        ]

    def reset(self) -> None:
        self.proxy.paths.clear()
        self.heal()

    def heal(self) -> None:
        self.proxy.fault = self.proxy.fault_paths = None


@pytest.fixture(scope="module")
def probing(iceberg_server: SeaweedIceberg) -> Iterator[Probing]:
    iceberg_server.catalog().create_namespace(NAMESPACE)
    proxy = S3Proxy(iceberg_server.endpoint).start()
    env = {
        "LAKE_ICEBERG_S3_ENDPOINT": proxy.endpoint,
        "LAKE_ICEBERG_S3_TIMEOUT_MS": str(TIMEOUT_MS),
    }
    try:
        with in_process_federation(iceberg_server, NAMESPACE, env) as federation:
            yield Probing(iceberg_server, proxy, federation)
    finally:
        proxy.stop()


def _many_files(server: SeaweedIceberg, name: str) -> Any:
    """A table of FILES data files (one append each)."""
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = server.catalog().create_table((NAMESPACE, name), schema=schema)
    for part in range(FILES):
        table.append(pa.table({"id": pa.array([part], pa.int64())}))
    return server.catalog().load_table((NAMESPACE, name))


def _pinned(probing: Probing, name: str) -> Any:
    """The table pinned as a DoGet pins it, its files planned as a scan plans them.

    A direct read plans as it reads (lake_iceberg.federation.scan), so the
    scan is read through: every file is then planned, as when a read fails.
    """
    federation = probing.federation
    table = federation.pinned(NAMESPACE, name, federation.plan(NAMESPACE, name).snapshot_id)
    batches = table.batches(pa.schema([("id", pa.int64())]), 1024)
    assert batches is not None
    assert sum(batch.num_rows for batch in batches) == FILES  # one row per file
    return table


@pytest.fixture(scope="module")
def many(probing: Probing) -> str:
    _many_files(probing.server, "many")
    return "many"


def test_whole_storage_is_probed_at_most_probe_limit_times(probing: Probing, many: str) -> None:
    table = _pinned(probing, many)
    probing.reset()
    assert table.scan_failure(RuntimeError("a scan failed")) is None
    probed = probing.probed()
    assert len(probed) == PROBE_LIMIT < FILES, probed
    # Every HEAD was an existence check of a data file: the files were planned already.
    assert sum(n for (method, _), n in probing.proxy.paths.items() if method == "HEAD") == (
        PROBE_LIMIT
    )


def test_failing_storage_is_unavailable_after_a_capped_probe(probing: Probing, many: str) -> None:
    table = _pinned(probing, many)
    probing.reset()
    probing.proxy.fault = "unavailable"
    try:
        found = table.scan_failure(RuntimeError("a scan failed"))
    finally:
        probing.heal()
    assert isinstance(found, Unavailable), found
    assert found.retryable
    assert 0 < len(probing.probed()) <= PROBE_LIMIT


def test_a_silent_store_costs_one_timeout_not_one_per_file(probing: Probing, many: str) -> None:
    table = _pinned(probing, many)
    probing.reset()
    probing.proxy.fault = "stall"
    start = time.monotonic()
    try:
        found = table.scan_failure(RuntimeError("a scan failed"))
        elapsed = time.monotonic() - start
        stalled = probing.proxy.stalled
    finally:
        probing.heal()
    assert isinstance(found, Unavailable), found
    assert stalled > 0  # the proxy really held requests unanswered
    # One storage timeout for the whole probe (plus scheduling slack), far below
    # one timeout per file (FILES s) or per probe (PROBE_LIMIT s).
    assert elapsed < TIMEOUT_MS / 1000 + 2.5, elapsed
    assert len(probing.probed()) <= PROBE_LIMIT


def test_a_missing_file_among_those_probed_is_data_corrupted(probing: Probing) -> None:
    table = _many_files(probing.server, "gone")
    pinned = _pinned(probing, "gone")
    path = next(iter(table.scan().plan_files())).file.file_path
    location = urlparse(path)
    probing.server.client().delete_object(Bucket=location.netloc, Key=location.path.lstrip("/"))
    probing.reset()
    found = pinned.scan_failure(RuntimeError("a scan failed"))
    assert isinstance(found, DataCorrupted), found
    assert f"iceberg.{NAMESPACE}.gone snapshot {pinned.snapshot_id}" in str(found)
    assert 0 < len(probing.probed()) <= PROBE_LIMIT


def test_an_unplanned_scan_reads_only_the_first_manifests(probing: Probing, many: str) -> None:
    """iceberg-rust's scan (never planned by Lake): the probe finds its files cheaply."""
    federation = probing.federation
    table = federation.pinned(NAMESPACE, many, federation.plan(NAMESPACE, many).snapshot_id)
    probing.reset()
    assert table.scan_failure(RuntimeError("a scan failed")) is None
    assert len(probing.probed()) == PROBE_LIMIT
    manifests = [
        p for (method, p) in probing.proxy.paths if method == "GET" and p.endswith(".avro")
    ]
    # The manifest list, then one manifest per data file probed (one append each),
    # not every one of the snapshot's FILES manifests.
    assert len(manifests) <= PROBE_LIMIT + 1 < FILES, manifests
