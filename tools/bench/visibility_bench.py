"""How soon another client sees a committed version, on a replica that did not take it.

Two Query replicas: A forwards appends, B only reads, both with the default
``LAKE_QUERY_CATALOG_REFRESH_MS`` (1000; 250 in quick mode). While fleet
writers append continuously through A (4 threads, 1 in quick mode, to
another table) a probe appends one row through A and, from the moment A
acknowledges it, plans ``count(*)`` on B with plain pyarrow Flight (no
``lake-min-versions`` header, as any other client) every 5 ms until the row
is there.

``visibility_lag_vs_bound``: that lag against the documented bound, the
refresh interval plus one ``catalog_snapshot`` round trip to Metasrv,
measured in the same pair (a MetaClient asking for the whole snapshot).
The reference is a computed bound, not a measured alternative. Goal: the
ratio's median and third quartile <= 1. The largest lag seen is printed to
stderr; docs/consistency.md records the figures measured.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

import lake_sdk
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tools.bench.harness import Figure, alternate, at_most, figure, pairs_for, warmup_for
from tools.lake_testing.data import EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

PROBE = TableRef("bench", "visible")
FLEET = TableRef("bench", "fleet")
PROBE_SCHEMA = pa.schema([("n", pa.int64())])
POLL_S = 0.005


@contextmanager
def _replicas(
    root: Path, refresh_ms: int
) -> Iterator[tuple[LakeProcess, LakeProcess, LakeProcess]]:
    env = {"LAKE_QUERY_CATALOG_REFRESH_MS": str(refresh_ms), "LAKE_COMPACTION": "off"}
    started: list[LakeProcess] = []
    try:
        started.append(start_meta(root / "data", root, env=env))
        started.append(start_query(started[0].addr, root, env=env))
        started.append(start_query(started[0].addr, root, env=env))
        yield started[0], started[1], started[2]
    finally:
        for process in reversed(started):
            process.stop()


def _count(client: flight.FlightClient, table: TableRef) -> int:
    command = any_pb2.Any()
    command.Pack(flight_sql_pb2.CommandStatementQuery(query=f"SELECT count(*) AS n FROM {table}"))
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command.SerializeToString()))
    return int(client.do_get(info.endpoints[0].ticket).read_all().column("n")[0].as_py())


def _snapshot_rtt_ms(meta: LakeProcess) -> float:
    async def go() -> float:
        async with MetaClient(f"http://{meta.addr}") as client:
            began = time.perf_counter()
            await client.catalog_snapshot(None)
            return 1000 * (time.perf_counter() - began)

    return asyncio.run(go())


def run(quick: bool) -> list[Figure]:
    refresh_ms = 250 if quick else 1000
    writers = 1 if quick else 4
    with (
        tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp,
        _replicas(Path(tmp), refresh_ms) as (meta, a, b),
    ):
        create_table(meta.addr, PROBE, PROBE_SCHEMA)
        create_table(meta.addr, FLEET, EPISODES_SCHEMA)
        stop = threading.Event()
        appended = [0] * writers

        def write(index: int) -> None:
            with lake_sdk.Client(a.url) as client:
                while not stop.is_set():
                    client.append_batches(FLEET, [episodes(0, 1000)])
                    appended[index] += 1

        fleet = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(writers)]
        lags: list[float] = []
        with lake_sdk.Client(a.url) as probe, flight.FlightClient(b.url) as reader:
            rows = _count(reader, PROBE)
            for thread in fleet:
                thread.start()

            def lag_ms() -> float:
                nonlocal rows
                probe.append_batches(PROBE, [pa.record_batch({"n": [rows]}, PROBE_SCHEMA)])
                acked = time.perf_counter()
                rows += 1
                while _count(reader, PROBE) < rows:
                    time.sleep(POLL_S)
                lag = 1000 * (time.perf_counter() - acked)
                lags.append(lag)
                return lag

            try:
                samples = alternate(
                    {"lake": lag_ms, "reference": lambda: refresh_ms + _snapshot_rtt_ms(meta)},
                    pairs=pairs_for(quick) or 30,
                    warmup=warmup_for(quick),
                )
            finally:
                stop.set()
                for thread in fleet:
                    thread.join(timeout=60)
        print(
            f"# visibility: refresh {refresh_ms} ms, {writers} writers, "
            f"{sum(appended)} fleet appends; lag max {max(lags):.0f} ms",
            file=sys.stderr,
        )
    return [
        figure(
            "visibility_lag_vs_bound",
            samples["lake"],
            samples["reference"],
            unit="ms",
            goal=at_most(1.0, "visible within LAKE_QUERY_CATALOG_REFRESH_MS + one refresh RTT"),
            load_1m=samples.load_1m,
            reference_kind="bound",
        )
    ]
