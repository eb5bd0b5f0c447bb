"""Real Query and Metasrv processes with /metrics and JSON logs on.

A workload whose table name and SQL carry unique markers runs through the
SDK; the scrape shows the series moving, and neither /metrics nor any log
line above DEBUG carries the SQL, the markers (in /metrics) or the ticket.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.integrity import VERIFY_TABLE, VerifyTableRequest, VerifyTableResult
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2 as sql_pb
from tests.telemetry.scrape import json_lines, scrape, value
from tools.lake_testing.data import EPISODES_SCHEMA, episodes
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query

TELEMETRY_ENV = {"LAKE_LOG_FORMAT": "json", "LAKE_LOG_LEVEL": "debug"}


@pytest.fixture
def observed(tmp_path: Path) -> Iterator[tuple[LakeProcess, int, LakeProcess, int]]:
    meta_port, query_port = free_port(), free_port()
    env = {
        **TELEMETRY_ENV,
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(tmp_path / "keys.json")),
        "LAKE_MANAGED_OBJECT_ROOT": str(tmp_path / "data" / "objects"),
    }
    meta = start_meta(
        tmp_path / "data", tmp_path, env={**env, "LAKE_METRICS_ADDR": f"127.0.0.1:{meta_port}"}
    )
    try:
        query = start_query(
            meta.addr, tmp_path, env={**env, "LAKE_METRICS_ADDR": f"127.0.0.1:{query_port}"}
        )
        try:
            yield meta, meta_port, query, query_port
        finally:
            query.stop()
    finally:
        meta.stop()


def _ticket(query: LakeProcess, sql: str) -> bytes:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
    client = flight.FlightClient(query.url)
    try:
        info = client.get_flight_info(
            flight.FlightDescriptor.for_command(wrapper.SerializeToString())
        )
        ticket = info.endpoints[0].ticket
        rows = client.do_get(ticket).read_all().num_rows
        assert rows >= 1
        return bytes(ticket.ticket)
    finally:
        client.close()


def test_scrape_after_a_workload_moves_every_series_and_leaks_no_marker(observed) -> None:
    meta, meta_port, query, query_port = observed
    marker = "zqmark" + os.urandom(4).hex()
    sql_marker = "zqsql" + os.urandom(4).hex()
    table = TableRef("robots", f"t_{marker}")

    async def create() -> None:
        async with MetaClient(meta.http_url) as admin:
            await admin.create_table(table, EPISODES_SCHEMA)

    asyncio.run(create())
    sql = f"SELECT steps, '{sql_marker}' AS tag FROM robots.t_{marker} WHERE steps >= 0"
    with lake_sdk.Client(f"http://{query.addr}") as client:
        client.append_batches(table, [episodes(0, 5)])
        client.append_batches(table, [episodes(5, 5)])
        assert client.query_table(sql).num_rows == 10
        assert client.object_store().descriptor is not None

    async def maintain() -> None:
        async with MetaClient(meta.http_url) as admin:
            await admin.optimize_table(table)
            request = VerifyTableRequest(table=table, all_versions=False)
            assert (await admin.action(VERIFY_TABLE, request, VerifyTableResult)).ok

    asyncio.run(maintain())
    ticket = _ticket(query, sql)

    q = scrape(query_port)
    assert value(q, "lake_rpc_duration_seconds_count", method="DoGet", code="OK") >= 1
    assert value(q, "lake_rpc_duration_seconds_count", method="DoPut", code="OK") >= 2
    assert value(q, "lake_query_admitted_total") >= 2
    assert value(q, "lake_query_rows_streamed_total") >= 10
    assert value(q, "lake_query_bytes_streamed_total") > 0
    assert value(q, "lake_query_catalog_snapshot_refreshes_total", outcome="changed") >= 1
    assert value(q, "lake_query_catalog_cache_lookups_total", result="hit") >= 1
    assert value(q, "lake_query_admission_running") == 0
    assert value(q, "lake_query_admission_refused_total") == 0
    assert value(q, "lake_query_stage_mints_total", kind="discovery", outcome="ok") >= 1
    assert value(q, "process_resident_memory_bytes") > 0
    assert value(q, "process_open_fds") > 0
    assert value(q, "process_cpu_seconds_total") > 0

    m = scrape(meta_port)
    assert value(m, "lake_metasrv_commits_total", outcome="committed") == 2
    assert value(m, "lake_metasrv_commit_duration_seconds_count", outcome="committed") == 2
    assert value(m, "lake_metasrv_commit_group_size_count") >= 1
    assert value(m, "lake_metasrv_leader") == 1
    assert value(m, "lake_metasrv_maintenance_runs_total", kind="compact", outcome="ok") == 1
    assert value(m, "lake_verify_runs_total", outcome="ok") == 1
    assert value(m, "lake_rpc_duration_seconds_count", method="DoAction", code="OK") >= 1

    for text in (q, m):
        assert marker not in text
        assert sql_marker not in text

    logs = {p.name: p.log() for p in (meta, query)}
    secrets = (ticket.decode("latin-1"), base64.b64encode(ticket).decode())
    for name, log in logs.items():
        records = json_lines(log)  # every line one JSON object, the banner included
        assert any(str(r.get("event", "")).startswith("lake ") for r in records), name
        for record in records:
            line = str(record)
            if sql_marker in line or "SELECT" in line:
                assert record["level"] == "debug", f"SQL above DEBUG in {name}: {record}"
            assert not any(s in line for s in secrets if s), f"a ticket in {name}'s log"
    request_ids = [r for r in json_lines(logs[query.name]) if "request_id" in r]
    assert request_ids, "records of RPCs carry a request id"


@pytest.mark.parametrize(
    ("module", "addr"),
    [
        ("lake_query", "0.0.0.0:9464"),
        ("lake_query", "localhost:9464"),
        ("lake_metasrv", "10.1.2.3:1"),
    ],
)
def test_a_non_loopback_metrics_address_refuses_to_start(
    module: str, addr: str, tmp_path: Path
) -> None:
    args = ["--addr", f"127.0.0.1:{free_port()}"]
    if module == "lake_metasrv":
        args += ["--data-dir", str(tmp_path / "data")]
    else:
        args += ["--metadata-addr", f"http://127.0.0.1:{free_port()}"]
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env={**os.environ, "LAKE_METRICS_ADDR": addr},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "LAKE_METRICS_ADDR" in done.stderr
    assert not (tmp_path / "data").exists(), "refused before touching the data directory"


def test_metrics_labels_are_closed_sets() -> None:
    from lake_core.telemetry.metrics import counter

    tagged = counter("lake_test_closed_total", "test only", {"outcome": ("ok", "failed")})
    tagged.inc(outcome="ok")
    with pytest.raises(ValueError, match="closed set") as caught:
        tagged.inc(outcome="robots.secret_table")
    assert "secret_table" not in str(caught.value)
    with pytest.raises(ValueError, match="takes labels"):
        tagged.inc(table="x")


def test_redaction_masks_tokens_presigned_urls_and_sql() -> None:
    from lake_core.logs import redact

    url = "https://s3.example/b/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA&X-Amz-Signature=abc"
    event = redact(
        None,
        "info",
        {
            "event": "call failed",
            "level": "info",
            "error": f"Bearer lk_abcdefghijklmnop at {url}",
            "token": "lk_zzzzzzzzzzzz",
            "sql": "SELECT 1",
        },
    )
    text = str(event)
    assert "lk_" not in text
    assert "X-Amz-Signature" not in text
    assert "AKIA" not in text
    assert "SELECT" not in text
    assert redact(None, "debug", {"event": "plan", "level": "debug", "sql": "SELECT 1"})["sql"]
    assert pa is not None


def test_redaction_fast_path_matches_the_patterns_on_generated_text() -> None:
    """The one-search pre-check never skips text a secret pattern would change."""
    import random

    from lake_core.logs import _scrub, _substitute

    pieces = ["Bearer ", "BEARER\t", "bearer", "lk_", "LK_", "lk_abcdefgh12", "?", "https://h/k",
              "X-Amz-Signature=ab", "sig=1", "signature=", "aws_secret_access_key=", "AWS_SESSION_TOKEN:",
              "aws_", " ", "'", '"', ",", "=", "x", "k\u212a", "\u017f", "plain words", "/p?q=1"]  # fmt: skip
    rng = random.Random(20261205)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
        assert _scrub(text) == _substitute(text), text


def test_records_below_the_level_are_dropped_before_the_processors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging

    import structlog

    from lake_core import logs

    seen: list[str] = []

    def spy(_: object, method: str, event: dict[str, object]) -> dict[str, object]:
        seen.append(method)
        return event

    monkeypatch.setattr(logs, "add_trace_ids", spy)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    config = structlog.get_config()
    try:  # console: json would also wrap this process's stdout and stderr
        logs.configure_logging(logging.INFO, {}, log_format="console")
        log = structlog.get_logger("lake.test.levels")
        log.debug("hidden", sql="SELECT 1")
        log.info("shown")
        assert seen == ["info"]
        logs.configure_logging(logging.DEBUG, {}, log_format="console")
        structlog.get_logger("lake.test.levels.debug").debug("shown at debug")
        assert seen == ["info", "debug"]
    finally:
        root.handlers[:], root.level = saved
        structlog.configure(**config)


@pytest.mark.parametrize(
    ("raw", "host", "port"), [("127.0.0.1:9090", "127.0.0.1", 9090), ("[::1]:9464", "::1", 9464)]
)
def test_loopback_metrics_addresses_parse(raw: str, host: str, port: int) -> None:
    from lake_core.telemetry.endpoint import metrics_address

    address = metrics_address({"LAKE_METRICS_ADDR": raw})
    assert address is not None
    assert (address.host, address.port) == (host, port)
    assert metrics_address({}) is None


@pytest.mark.parametrize(
    "raw", ["0.0.0.0:9090", "[::]:9090", "192.168.1.1:9090", "localhost:9090", "127.0.0.1:0",
            "127.0.0.1:99999", "127.0.0.1", "127.0.0.1:x"],
)  # fmt: skip
def test_other_metrics_addresses_are_config_errors(raw: str) -> None:
    from lake_core.errors import ConfigError
    from lake_core.telemetry.endpoint import metrics_address

    with pytest.raises(ConfigError, match="LAKE_METRICS_ADDR"):
        metrics_address({"LAKE_METRICS_ADDR": raw})


@pytest.mark.parametrize("env", [{"LAKE_LOG_FORMAT": "xml"}, {"LAKE_LOG_LEVEL": "loud"}])
def test_bad_log_settings_are_config_errors(env: dict[str, str]) -> None:
    from lake_core.errors import ConfigError
    from lake_core.logs import log_settings

    with pytest.raises(ConfigError):
        log_settings(env)
