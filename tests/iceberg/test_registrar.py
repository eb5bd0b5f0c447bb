"""Shipped segments registered in Iceberg exactly once, read back through pyiceberg."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from lake_iceberg.registrar.segments import SegmentCatalog
from lake_iceberg.registrar.service import Registrar
from tests.iceberg.conftest import PIPELINE, Lane, data_files, field, segment_keys
from tools.lake_testing.catalog_proxy import CatalogProxy

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

POSE = pa.schema(
    [field("robot", pa.string(), 1), field("t", pa.int64(), 2), field("x", pa.float64(), 3)]
)
EVENTS = pa.schema([field("code", pa.int32(), 7), field("msg", pa.string(), 9)])


def lake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from lake_core.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def write_sinks(lane: Lane, path: Path, **overrides: object) -> Path:
    """The spec's shape: a whole ``sinks:`` document whose iceberg entry is used."""
    document = {
        "sinks": [
            {"id": "local", "kind": "parquet", "config": {"datasets": ["pose", "events"]}},
            {"id": "s3", "kind": "object_store", "config": {"from": "local", "pipeline": PIPELINE}},
            {"id": "iceberg", "kind": "iceberg", "config": lane.raw_config(**overrides)},
        ]
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_cli_ships_and_registers_once_across_restarts(lane: Lane) -> None:
    lane.write("pose", "000001", POSE, {"robot": ["r1", "r2"], "t": [1, 2], "x": [0.5, 1.5]})
    lane.write("pose", "000002", POSE, {"robot": ["r3"], "t": [3], "x": [2.5]})
    lane.write("events", "000001", EVENTS, {"code": [404, 500], "msg": ["lost", "boom"]})
    # A segment still being written is never shipped.
    (lane.segments / "pose" / ".000003.parquet.partial").write_bytes(b"PAR1 half")
    env = lane.server.env()
    shipped = lake(
        "segments", "ship", str(lane.segments), "--to", lane.url, "--pipeline", PIPELINE, env=env
    )
    assert shipped.returncode == 0, shipped.stderr
    assert "shipped 3" in shipped.stdout

    config = write_sinks(lane, lane.root / "registrar.yaml")
    first = lake("iceberg", "registrar", "--config", str(config), "--once")
    assert first.returncode == 0, first.stderr
    assert "registered 3, skipped 0, pending 0" in first.stdout
    assert lane.server.secret_key not in first.stderr + first.stdout

    pose = lane.table("pose")
    assert [(f.field_id, f.name) for f in pose.schema().fields] == [
        (1, "robot"),
        (2, "t"),
        (3, "x"),
    ]
    rows = pose.scan().to_arrow().sort_by("t")
    assert rows.num_rows == 3
    assert rows.column("robot").to_pylist() == ["r1", "r2", "r3"]
    assert rows.column("x").to_pylist() == [0.5, 1.5, 2.5]
    events = lane.table("events")
    assert [(f.field_id, f.name) for f in events.schema().fields] == [(7, "code"), (9, "msg")]
    assert sorted(events.scan().to_arrow().column("code").to_pylist()) == [404, 500]
    # Metadata-only: the table references the shipped objects themselves.
    prefix = f"s3://{lane.bucket}/fleet/lake/v1/{PIPELINE}/pose/"
    assert data_files(pose) == [prefix + "000001.parquet", prefix + "000002.parquet"]

    # Restart: nothing appended twice, one snapshot and one data file per segment.
    again = lake("iceberg", "registrar", "--config", str(config), "--once")
    assert again.returncode == 0, again.stderr
    assert "registered 0, skipped 3" in again.stdout
    pose = lane.table("pose")
    assert len(pose.snapshots()) == 2
    assert len(data_files(pose)) == 2
    assert len(segment_keys(pose)) == 2
    assert len(lane.table("events").snapshots()) == 1


def test_crash_mid_ship_reships_without_a_second_entry(lane: Lane) -> None:
    path = lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    # The state a crash after the upload and before the record leaves behind.
    key = f"fleet/lake/v1/{PIPELINE}/pose/000001.parquet"
    lane.s3().put_object(Bucket=lane.bucket, Key=key, Body=path.read_bytes())
    assert lane.ship().shipped[0].object_key == key
    assert lane.ship().skipped == 1
    with SegmentCatalog(lane.segments) as catalog:
        entries = catalog.entries()
    assert [e.object_key for e in entries] == [key]
    assert entries[0].size == path.stat().st_size
    body = lane.s3().get_object(Bucket=lane.bucket, Key=key)["Body"].read()
    assert body == path.read_bytes()


def test_lost_commit_response_converges_on_one_data_file(lane: Lane) -> None:
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    lane.ship()
    assert Registrar(lane.config()).run_once().registered == 1

    lane.write("pose", "000002", POSE, {"robot": ["r2"], "t": [2], "x": [1.0]})
    lane.ship()
    proxy = CatalogProxy(lane.server.iceberg_endpoint, lose_commit_responses=1).start()
    try:
        progress = Registrar(lane.config(catalog_uri=proxy.endpoint)).run_once()
    finally:
        proxy.stop()
    assert proxy.requests["commit"] == 1  # the lost commit landed: no second append
    assert (progress.registered, progress.skipped) == (0, 2)
    table = lane.table("pose")
    assert len(data_files(table)) == 2
    assert len(table.snapshots()) == 2
    assert len(set(segment_keys(table))) == 2


def test_catalog_5xx_is_transient(lane: Lane) -> None:
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    lane.ship()
    proxy = CatalogProxy(lane.server.iceberg_endpoint, fail_requests=3).start()
    try:
        progress = Registrar(lane.config(catalog_uri=proxy.endpoint)).run_once()
    finally:
        proxy.stop()
    assert progress.registered == 1
    assert len(data_files(lane.table("pose"))) == 1


def test_unreachable_catalog_backs_off_then_registers(lane: Lane) -> None:
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    lane.ship()
    proxy = CatalogProxy(lane.server.iceberg_endpoint)  # its port is closed until started
    sleeps: list[float] = []

    def sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) == 2:
            proxy.start()

    try:
        progress = Registrar(lane.config(catalog_uri=proxy.endpoint), sleep=sleep).run_once()
    finally:
        proxy.stop()
    assert progress.registered == 1
    assert sleeps == [0.02, 0.04]  # retry.initial, doubled: the configured backoff


def test_service_registers_segments_shipped_while_it_runs(lane: Lane) -> None:
    import threading

    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    lane.ship()
    registrar = Registrar(lane.config())
    stop = threading.Event()
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            registrar.run(poll_interval=0.1, stop=stop)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert _eventually(
            lambda: lane.table_exists("pose") and len(lane.table("pose").snapshots()) == 1
        )
        lane.write("pose", "000002", POSE, {"robot": ["r2"], "t": [2], "x": [1.0]})
        lane.ship()
        assert _eventually(lambda: len(lane.table("pose").snapshots()) == 2)
    finally:
        stop.set()
        thread.join(60)
    assert not failures
    assert not thread.is_alive()
    assert len(data_files(lane.table("pose"))) == 2


def _eventually(check: Callable[[], bool], timeout_s: float = 90.0) -> bool:
    """Poll ``check`` until it holds (a generous bound: the machine may be busy)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_a_segment_with_a_damaged_footer_is_a_typed_fatal_error(lane: Lane) -> None:
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    path = lane.write("pose", "000002", POSE, {"robot": ["r2"], "t": [2], "x": [1.0]})
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    for i in range(len(data) - 8 - length, len(data) - 8, 3):
        data[i] ^= 0xFF  # magic and length intact: only the footer's bytes are damaged
    path.write_bytes(bytes(data))
    lane.ship()
    config = write_sinks(lane, lane.root / "registrar.yaml")
    result = lake("iceberg", "registrar", "--config", str(config), "--once")
    # Not a raw OSError traceback from pyarrow: the catalog entry that cannot hold, named.
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "segments.catalog" in result.stderr
    assert "000002.parquet: its Parquet footer is damaged" in result.stderr
    # The good segment before it registered; the damaged one did not.
    prefix = f"s3://{lane.bucket}/fleet/lake/v1/{PIPELINE}/pose/"
    assert data_files(lane.table("pose")) == [prefix + "000001.parquet"]


def _replace_object(lane: Lane, dataset: str, segment: str, data: bytes) -> None:
    """Overwrite a shipped object behind the segment catalog's back."""
    key = f"fleet/lake/v1/{PIPELINE}/{dataset}/{segment}"
    lane.s3().put_object(Bucket=lane.bucket, Key=key, Body=data)


def test_a_segment_whose_bytes_are_not_the_shipped_digest_is_refused(lane: Lane) -> None:
    """A flipped data byte, a replaced object and a short one (valid footers) are not registered.

    The footer alone cannot tell: both objects read as valid Parquet of the
    recorded size. Only the SHA-256 the shipper recorded can; the registrar
    refuses them, registers the segments around them, and says which it refused.
    """
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    flipped = lane.write("pose", "000002", POSE, {"robot": ["r2"], "t": [2], "x": [1.0]})
    lane.write("pose", "000003", POSE, {"robot": ["r3"], "t": [3], "x": [2.0]})
    lane.write("pose", "000004", POSE, {"robot": ["r4", "r5"], "t": [4, 5], "x": [3.0, 4.0]})
    lane.write("events", "000001", EVENTS, {"code": [1], "msg": ["a"]})
    lane.write("events", "000002", EVENTS, {"code": [2], "msg": ["b"]})
    lane.ship()
    data = bytearray(flipped.read_bytes())
    data[4] ^= 0x01  # inside the first column chunk: magic and footer intact
    _replace_object(lane, "pose", "000002.parquet", bytes(data))
    # Another segment's bytes (same schema, same size) under this key.
    other = (lane.segments / "events" / "000001.parquet").read_bytes()
    _replace_object(lane, "events", "000002.parquet", other)
    # A short upload that still ends in a valid footer (a smaller segment's bytes).
    _replace_object(
        lane, "pose", "000004.parquet", (lane.segments / "pose" / "000001.parquet").read_bytes()
    )
    config = write_sinks(lane, lane.root / "registrar.yaml")
    result = lake("iceberg", "registrar", "--config", str(config), "--once", "-o", "json")
    assert "Traceback" not in result.stderr
    prefix = f"s3://{lane.bucket}/fleet/lake/v1/{PIPELINE}/"
    assert sorted(data_files(lane.table("pose"))) == [
        prefix + "pose/000001.parquet",
        prefix + "pose/000003.parquet",
    ]
    assert data_files(lane.table("events")) == [prefix + "events/000001.parquet"]
    assert "segments.corrupted" in result.stderr
    refused = [line for line in result.stderr.splitlines() if "registrar.refused" in line]
    for key in ("pose/000002.parquet", "pose/000004.parquet", "events/000002.parquet"):
        assert any(key in line for line in refused), result.stderr
    # Refused segments are a failed pass: the exit status says so.
    assert result.returncode == 1, result.stderr
    assert '"refused": 3' in result.stdout


class _CountingS3:
    """The registrar's boto3 client, counting the object reads (GET) and probes (HEAD) it makes."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.gets: list[str] = []
        self.heads: list[str] = []

    def get_object(self, **kwargs: Any) -> Any:
        self.gets.append(kwargs["Key"])
        return self._client.get_object(**kwargs)

    def head_object(self, **kwargs: Any) -> Any:
        self.heads.append(kwargs["Key"])
        return self._client.head_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_refused_segment_is_not_read_again_until_its_object_changes(lane: Lane) -> None:
    """Each pass meets a refused segment again; it costs a HEAD, not its whole object.

    Before, every pass (every 5 s of a running registrar) downloaded and hashed
    the refused object again. A re-shipped object (new bytes, a new ETag) is
    checked in full and registered.
    """
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    damaged = lane.write("pose", "000002", POSE, {"robot": ["r2"], "t": [2], "x": [1.0]})
    lane.ship()
    good = damaged.read_bytes()
    data = bytearray(good)
    data[4] ^= 0x01
    _replace_object(lane, "pose", "000002.parquet", bytes(data))
    s3 = _CountingS3(lane.s3())
    registrar = Registrar(lane.config(), s3=s3)
    key = f"fleet/lake/v1/{PIPELINE}/pose/000002.parquet"

    first = registrar.run_once()
    assert (first.registered, first.refused) == (1, 1)
    reads = s3.gets.count(key)
    assert reads >= 1
    for _ in range(3):
        again = registrar.run_once()
        assert (again.registered, again.refused) == (0, 1)
    assert s3.gets.count(key) == reads  # not downloaded again
    assert s3.heads.count(key) == 3

    _replace_object(lane, "pose", "000002.parquet", good)  # re-shipped intact
    fixed = registrar.run_once()
    assert (fixed.registered, fixed.refused) == (1, 0)
    assert s3.gets.count(key) > reads
    prefix = f"s3://{lane.bucket}/fleet/lake/v1/{PIPELINE}/pose/"
    assert sorted(data_files(lane.table("pose"))) == [
        prefix + "000001.parquet",
        prefix + "000002.parquet",
    ]
