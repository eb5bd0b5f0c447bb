"""Pages over plain HTTP: as of an instant, the Cluster page, typed refusals of bad input."""

from __future__ import annotations

import re
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path

from tests.console.conftest import TOKENS, Console
from tools.lake_testing.console import Session, start_console
from tools.lake_testing.servers import LakeProcess, free_port

COUNT = "SELECT count(*) AS n FROM lake.robots.episodes"


def _rows(page: str) -> list[str]:
    return re.findall(r'<tr data-testid="result-row">(.*?)</tr>', page)


def test_as_of_an_instant_and_a_version(console: Console) -> None:
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for as_of, count in ((now, "120"), ("v1", "3"), ("0", "0")):
        page = session.request("/query?" + urllib.parse.urlencode({"sql": COUNT, "as_of": as_of}))
        assert page.status == 200, page.text[-800:]
        [row] = _rows(page.text)
        assert f'<td class="num">{count}</td>' in row
    bad = session.request("/query?" + urllib.parse.urlencode({"sql": COUNT, "as_of": "yesterday"}))
    assert bad.status == 400
    assert 'data-testid="error"' in bad.text
    assert ">InvalidArgument</strong>" in bad.text


def test_bad_input_is_refused_typed(console: Console) -> None:
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    sql = urllib.parse.urlencode({"sql": COUNT})
    assert session.request(f"/download?{sql}&format=xlsx").status == 400
    assert session.request(f"/query?{sql}&page=-1").status == 400
    assert session.request("/file?loc=not-a-location").status == 400
    refused = session.request(
        "/download?" + urllib.parse.urlencode({"sql": "DROP TABLE x"}) + "&format=csv"
    )
    assert refused.status == 400
    assert refused.text.startswith("ReadOnlySql:")


def test_a_download_failing_as_it_runs_gets_a_typed_status(console: Console) -> None:
    """Planned fine, failing at its first batch: a typed error, not a 200 cut after its headers."""
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    sql = "SELECT episode_id / (episode_id - episode_id) AS q FROM robots.episodes"
    for kind in ("csv", "parquet", "arrow"):
        reply = session.request("/download?" + urllib.parse.urlencode({"sql": sql, "format": kind}))
        assert reply.status == 400, reply.text[:300]
        assert "Divide by zero" in reply.text
    # An empty result still downloads (its header only).
    empty = "SELECT episode_id FROM robots.episodes WHERE episode_id < 0"
    csv = session.request("/download?" + urllib.parse.urlencode({"sql": empty, "format": "csv"}))
    assert csv.status == 200
    assert csv.text.strip() == '"episode_id"'


def _replica_rows(page: str) -> list[str]:
    return re.findall(r'<tr data-testid="replica">(.*?)</tr>', page)


def test_cluster_page_shows_each_replicas_health_catalog_admission_and_memory(
    console: Console, lake: LakeProcess, tmp_path: Path
) -> None:
    # The console's own Query, the same replica by another name, and one that is down.
    port = lake.url.rsplit(":", 1)[1]
    down = f"grpc://127.0.0.1:{free_port()}"
    cluster = start_console(lake.url, tmp_path, replicas=[f"grpc://localhost:{port}", down])
    try:
        admin = Session(cluster.url)
        admin.sign_in(TOKENS["acme"])
        page = admin.request("/cluster")
        assert page.status == 200, page.text[-800:]
        assert 'data-testid="cluster"' in page.text
        first, second, third = _replica_rows(page.text)
        for row in (first, second):
            assert "<td>SERVING</td>" in row
            assert re.search(r"<td>\d+ tables, generation [^<]+, \d+\.\d s old</td>", row)
            assert re.search(r"<td>\d+ of \d+</td>", row)  # running of the admission limit
            assert re.search(r"<td>[\d,]+ MiB of [\d,]+ MiB</td>", row)  # the memory pool
        assert lake.url in first
        assert down in third
        assert '<strong class="error-class">Unavailable</strong>' in third
        # Status is for administrators: anyone else sees the typed refusal per replica.
        user = Session(cluster.url)
        user.sign_in(TOKENS["globex"])
        rows = _replica_rows(user.request("/cluster").text)
        assert len(rows) == 3
        assert all('<strong class="error-class">' in row for row in rows)
        assert '<strong class="error-class">PermissionDenied</strong>' in rows[0]
        assert TOKENS["acme"] not in cluster.log()
        assert TOKENS["globex"] not in cluster.log()
    finally:
        cluster.stop()


def test_an_mcap_recording_lists_its_topics_and_time_range(console: Console) -> None:
    session = Session(console.url)
    session.sign_in(TOKENS["acme"])
    sql = "SELECT run_id, recording FROM robots.runs"
    page = session.request("/episode?" + urllib.parse.urlencode({"sql": sql, "row": "0"}))
    assert page.status == 200, page.text[-800:]
    assert 'data-testid="recording"' in page.text
    topics = re.findall(r'<tr data-testid="topic-item"><td>([^<]+)</td>', page.text)
    assert {"/events", "/joint_states"} <= set(topics)
    # Written by tools.lake_testing.recordings: 2 s from 2026-11-01T00:00:00Z.
    assert "from 2026-11-01T00:00:00+00:00 to 2026-11-01T00:00:01" in page.text
