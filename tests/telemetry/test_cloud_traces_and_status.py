"""Cloud mode, two Metasrv nodes: one append traced end to end; status across a failover.

Query reaches only the follower, so the append goes SDK -> Query ->
follower -> leader; a test-run OTLP receiver gets every hop's spans in one
trace with the right parents. ``lake client status`` names the leader, and
after the leader's SIGKILL names its successor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace

from lake_core.telemetry.tracing import configure_tracing
from tests.cloud.balancer import Balancer
from tests.cloud.conftest import CloudLake
from tests.telemetry.scrape import json_lines
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, episodes
from tools.lake_testing.otlp import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.dynamodb]

DO_PUT = "arrow.flight.protocol.FlightService/DoPut"
#: Query and Metasrv send a small append to Metasrv as one request (lake_core.flight.unary_put).
APPEND = "lake.metasrv.v1.Appends/Append"
SERVER, CLIENT = 2, 3  # OTLP SpanKind values


def _status(lake: CloudLake, addr: str, *extra: str) -> dict:
    token = lake.root / "admin-token"
    token.write_text(lake.tokens["admin"])
    token.chmod(0o600)
    env = {
        **os.environ,
        "LAKE_METADATA_AUTH_TOKEN_FILE": str(token),
        "LAKE_METADATA_CA_FILE": str(lake.ca.cert_file),
        "LAKE_METADATA_SERVER_NAME": "lake-meta.test",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from lake_core.cli import main; main()", "client", "--addr",
         f"https://{addr}", "status", "--json", *extra],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert lake.tokens["admin"] not in done.stdout
    return dict(json.loads(done.stdout))


def _chain(spans: list[ReceivedSpan]) -> list[ReceivedSpan] | None:
    """SDK client -> Query server -> Query client -> follower server -> its client -> leader."""
    roots = [
        s for s in spans if s.service == "lake-sdk-test" and s.name == DO_PUT and s.kind == CLIENT
    ]
    for root in roots:
        chain, current = [root], root
        for service, kind, name in [
            ("lake-query", SERVER, DO_PUT),
            ("lake-query", CLIENT, APPEND),
            ("lake-meta", SERVER, APPEND),
            ("lake-meta", CLIENT, APPEND),
            ("lake-meta", SERVER, APPEND),
        ]:
            child = next(
                (
                    s
                    for s in spans
                    if s.parent_id == current.span_id
                    and s.service == service
                    and s.kind == kind
                    and s.name == name
                ),
                None,
            )
            if child is None:
                break
            chain.append(child)
            current = child
        if len(chain) == 6:
            return chain
    return None


def test_one_append_is_one_trace_and_status_follows_the_leader(
    make_cloud_lake, tmp_path: Path
) -> None:
    receiver = OtlpReceiver().start()
    try:
        otel = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint}
        lake = make_cloud_lake(meta_env={**otel, "LAKE_LOG_FORMAT": "json"}, query_env=otel)
        principals = Path(lake.query_env["LAKE_AUTH_PRINCIPALS_FILE"])
        bindings = json.loads(principals.read_text())["bindings"]
        admin = {"token": lake.tokens["admin"], "principal_id": "ops", "tenant_id": "lake"}
        bindings.append({**admin, "role": "admin"})
        principals.write_text(json.dumps({"bindings": bindings}))

        leader = lake.start_meta()
        assert lake.wait_for_leader()[0] is leader
        follower = lake.start_meta()
        lake.balancer = Balancer([follower.addr]).start()  # Query reaches the follower only
        query = lake.start_query()
        lake.admin(lambda c: c.create_table(EPISODES, EPISODES_SCHEMA))

        tracing = configure_tracing("lake-sdk-test", otel)
        assert tracing is not None
        # The application's own span: the SDK's span of the append is its child.
        app = tracing.provider.get_tracer("robot-app").start_span("upload episode")
        with lake.sdk(query) as client, trace.use_span(app, end_on_exit=True):
            client.append_batches(EPISODES, [episodes(0, 3)])
        tracing.provider.force_flush()
        spans = receiver.wait_for(lambda got: _chain(got) is not None, timeout_s=60)
        chain = _chain(spans)
        assert chain is not None
        assert len({s.trace_id for s in chain}) == 1
        assert chain[0].trace_id == format(app.get_span_context().trace_id, "032x")
        assert chain[0].parent_id == format(app.get_span_context().span_id, "016x")
        assert chain[0].attributes["db.system.name"] == "lake"
        assert chain[0].attributes["db.operation.name"] == "append"
        for span in chain[1:]:
            assert span.attributes["rpc.system"] == "grpc"
            assert span.attributes["rpc.method"] == span.name.rsplit("/", 1)[1]
        assert [s.attributes["rpc.method"] for s in chain[1:]] == ["DoPut"] + ["Append"] * 4
        # The follower's log line about this append carries the trace and its span.
        forwarded = [
            r for r in json_lines(follower.log()) if r.get("event") == "forwarding to the leader"
        ]
        assert any(
            r.get("trace_id") == chain[0].trace_id
            and r.get("span_id") == chain[3].span_id
            and r.get("request_id")
            for r in forwarded
        ), forwarded
        marker_values = {lake.tokens[n] for n in lake.tokens} | {EPISODES.name}
        for span in spans:
            assert not marker_values & {str(v) for v in span.attributes.values()}

        before = _status(lake, leader.addr, "--node", f"https://{follower.addr}",
                         "--query", query.addr)  # fmt: skip
        roles = {m["addr"].rsplit(":", 1)[1]: m["role"] for m in before["metasrv"]}
        assert roles == {
            leader.addr.rsplit(":", 1)[1]: "leader",
            follower.addr.rsplit(":", 1)[1]: "follower",
        }
        assert before["leader"].endswith(leader.addr.rsplit(":", 1)[1])
        assert all(m["epoch"] >= 1 and m["version"] for m in before["metasrv"])
        replica = before["query"][0]
        assert replica["admission"]["running"] == 0
        assert replica["serving"] is True
        assert replica["not_serving"] == []
        assert replica["catalog_tables"] >= 1  # the episodes table appended to above
        assert 0 <= replica["memory"]["reserved_bytes"] <= replica["memory"]["limit_bytes"]
        assert replica["memory"]["limit_bytes"] > 0

        leader.kill()
        successor, _ = lake.wait_for_leader(other_than=leader, timeout_s=30)
        assert successor is follower
        after = _status(lake, follower.addr)
        assert after["metasrv"][0]["role"] == "leader"
        assert after["leader"].endswith(follower.addr.rsplit(":", 1)[1])
        assert after["metasrv"][0]["epoch"] > before["metasrv"][0]["epoch"]

        logs = lake.logs()
        assert not any(token in logs for token in lake.tokens.values()), "a token was logged"
    finally:
        receiver.stop()
