"""What metrics and tracing cost Query: the same workload on two replicas, telemetry on vs off.

One Metasrv, three Query replicas over it: one with ``LAKE_METRICS_ADDR`` and
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (exporting to an in-process OTLP
receiver, scraped once per pair), two with neither. Calls interleave, and each
pair compares the two sides' p50 over a block of calls: one call's jitter is
several percent here, so single calls could not resolve a 3% goal.

- ``telemetry_overhead_point_query_ms``: a point query's latency, on / off.
  Goal: <= 1.03.
- ``telemetry_overhead_doget_rows_per_s``: DoGet throughput of a full scan,
  on / off. Goal: >= 0.97.
- ``telemetry_overhead_aa_point_query_ms``: the same point query on the two
  telemetry-off replicas (report only): the floor this method can resolve,
  since two identical processes are not exactly equally fast.
"""

from __future__ import annotations

import asyncio
import tempfile
import urllib.request
from pathlib import Path

import lake_sdk
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tools.bench.harness import (
    Figure,
    at_least,
    at_most,
    machine,
    measure,
    timed,
    warmup_for,
)
from tools.lake_testing.data import EPISODES_SCHEMA, episodes
from tools.lake_testing.otlp import OtlpReceiver
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import free_port, start_meta, start_query

TABLE = TableRef("robots", "telemetry_bench")


#: Pairs and calls per side in each pair.
QUICK_PAIRS, PAIRS = 3, 21
QUICK_BLOCK, POINT_BLOCK, SCAN_BLOCK = 3, 11, 5


def run(quick: bool) -> list[Figure]:
    rows = 20_000 if quick else 400_000
    pairs = QUICK_PAIRS if quick else PAIRS
    point_block = QUICK_BLOCK if quick else POINT_BLOCK
    scan_block = QUICK_BLOCK if quick else SCAN_BLOCK
    receiver = OtlpReceiver().start()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {"LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "keys.json"))}
        meta = start_meta(root / "data", root, env=env)
        metrics_port = free_port()
        on_env = {
            **env,
            "LAKE_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        }
        processes = [meta]
        try:
            on = start_query(meta.addr, root, env=on_env)
            processes.append(on)
            off = start_query(meta.addr, root, env=env)
            processes.append(off)
            twin = start_query(meta.addr, root, env=env)
            processes.append(twin)

            async def create() -> None:
                async with MetaClient(meta.http_url) as admin:
                    await admin.create_table(TABLE, EPISODES_SCHEMA)

            asyncio.run(create())
            with lake_sdk.Client(f"http://{on.addr}") as client:
                for start in range(0, rows, 10_000):
                    client.append_batches(TABLE, [episodes(start, min(10_000, rows - start))])
            clients = {
                "on": lake_sdk.Client(f"http://{on.addr}"),
                "off": lake_sdk.Client(f"http://{off.addr}"),
                "twin": lake_sdk.Client(f"http://{twin.addr}"),
            }
            point = f"SELECT * FROM {TABLE.qualified} WHERE steps = 1234"
            scan = f"SELECT * FROM {TABLE.qualified}"
            calls = {"on": 0}

            def scrape() -> None:
                url = f"http://127.0.0.1:{metrics_port}/metrics"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    reply.read()

            def point_ms(side: str) -> float:
                if side == "on":
                    calls["on"] += 1
                    if calls["on"] % point_block == 0:
                        scrape()  # a Prometheus scrape now and then, as in production
                return 1000 * timed(lambda: clients[side].query_table(point))

            def rows_per_s(side: str) -> float:
                return rows / timed(lambda: clients[side].query_table(scan))

            try:
                figures = [
                    measure(
                        "telemetry_overhead_point_query_ms",
                        lambda: point_ms("on"),
                        lambda: point_ms("off"),
                        unit="ms",
                        goal=at_most(1.03, "metrics and tracing on: point query within 3%"),
                        pairs=pairs,
                        warmup=warmup_for(quick),
                        block=point_block,
                    ),
                    measure(
                        "telemetry_overhead_doget_rows_per_s",
                        lambda: rows_per_s("on"),
                        lambda: rows_per_s("off"),
                        unit="rows/s",
                        goal=at_least(0.97, "metrics and tracing on: DoGet throughput within 3%"),
                        pairs=pairs,
                        warmup=warmup_for(quick),
                        block=scan_block,
                    ),
                    measure(
                        "telemetry_overhead_aa_point_query_ms",
                        lambda: point_ms("twin"),
                        lambda: point_ms("off"),
                        unit="ms",
                        goal=None,
                        pairs=pairs,
                        warmup=warmup_for(quick),
                        block=point_block,
                    ),
                ]
            finally:
                for client in clients.values():
                    client.close()
        finally:
            for process in reversed(processes):
                process.stop()
            receiver.stop()
    return figures


if __name__ == "__main__":
    print(machine())
    for result in run(quick=False):
        print(result.json())
