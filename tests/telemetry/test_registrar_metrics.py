"""The Iceberg registrar service serves /metrics on LAKE_METRICS_ADDR, and its logs are JSON."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error

import pyarrow as pa
import pytest

from tests.iceberg.conftest import Lane, field
from tests.iceberg.test_registrar import write_sinks
from tests.telemetry.scrape import json_lines, scrape, value
from tools.lake_testing.servers import free_port

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

POSE = pa.schema(
    [field("robot", pa.string(), 1), field("t", pa.int64(), 2), field("x", pa.float64(), 3)]
)


def _registered(port: int, process: subprocess.Popen[bytes], timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the registrar exited"
        try:
            text = scrape(port)
            if value(text, "lake_registrar_segments_total", outcome="registered") >= 2:
                return text
        except (OSError, urllib.error.URLError, AssertionError):
            pass  # not listening yet, or no pass finished yet
        time.sleep(0.2)
    raise AssertionError("the registrar never reported two registered segments")


def test_registrar_metrics_move_and_its_logs_are_json_lines(lane: Lane) -> None:
    lane.write("pose", "000001", POSE, {"robot": ["r1"], "t": [1], "x": [0.0]})
    lane.write("pose", "000002", POSE, {"robot": ["r2"], "t": [2], "x": [1.0]})
    lane.ship()
    config = write_sinks(lane, lane.root / "registrar.yaml")
    port = free_port()
    log_path = lane.root / "registrar.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", "from lake_core.cli import main; main()", "iceberg",
             "registrar", "--config", str(config), "--poll", "200ms"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "LAKE_METRICS_ADDR": f"127.0.0.1:{port}", "LAKE_LOG_FORMAT": "json"},
        )  # fmt: skip
    try:
        text = _registered(port, process)
        assert value(text, "lake_registrar_passes_total", outcome="ok") >= 1
        assert value(text, "lake_registrar_passes_total", outcome="failed") == 0
        assert value(text, "process_resident_memory_bytes") > 0
        assert lane.namespace not in text
        assert lane.bucket not in text
    finally:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    records = json_lines(log_path.read_text())
    assert any(r.get("event") == "metrics serving" for r in records)
    assert lane.server.secret_key not in log_path.read_text()
