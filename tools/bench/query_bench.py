"""Query benchmarks through Lake Query, each against an in-process or C++ reference.

- ``doget_pinned_table``: a pinned Lance table of 4 numeric columns (512 MiB
  in full mode) fetched through Lake Query (planned on its listener, streamed
  by its native data plane, ``LAKE_QUERY_DATA_ADDR``, as clients follow the
  endpoint location), against pyarrow's C++ Flight
  server in another process streaming the same pinned Lance version through
  Lance's scanner at Lake's batch size. Goal: >= 1.0. Query's scan cache is on
  (``LAKE_QUERY_SCAN_CACHE_BYTES``, room for one such scan), and every one of
  Lake's samples is a first scan that the cache keeps: they alternate between
  two column orders (``SELECT *`` and ``SELECT c, b, a, id``: the same columns
  decoded, the same bytes sent), each evicting the other; the run checks that
  none of them was a cache hit.
- ``doget_server_cpu_per_gib``: server CPU seconds per GiB served, Lake's
  Query process against that reference's. Goal: <= 1.2x.
- ``doget_vs_memory``: Lake's first scans against the same C++ server streaming
  the same rows already in memory (no Lance decoding): report only, the gap is
  explained in docs/performance-analysis.md.
- ``doget_repeat_scan``: the second and later DoGets of the same pinned scan
  (ticket, planning and transfer included; served from Query's scan cache)
  against that C++ server sending the same rows from memory. Goal: >= 0.9.
- ``doget_repeat_scan_cpu_per_gib``: server CPU per GiB of those repeated
  scans against the C++ server's from memory. Goal: <= 1.5x.
- ``group_by_4m_rows``: a GROUP BY over 4 million rows through Lake (ticket,
  pinning and transfer included), against the same SQL run in-process by
  DataFusion on the same Lance version. Goal: <= 1.1x.
- ``random_access_30_rows``: 30 random keys (``id IN (...)``) through Lake
  against the same filter on an in-process Lance scan of the same version,
  answered through the same BTREE index. Goal: <= 2x.
- ``point_query_p50``: p50 of ``WHERE id = k`` through Lake against the same
  in-process Lance scan. Goal: <= +5 ms.

The table is loaded by appends of at most ``MAX_APPEND_ROWS`` rows, then optimized the way an operator would
(``optimize_table`` and a BTREE ``create_index`` on ``id`` through Metasrv),
so every figure reads the compacted, indexed version; the references open
exactly that Lance version. Both sides of a pair use the same keys.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from datafusion import SessionContext
from google.protobuf import any_pb2

from lake_core.config import (
    METRICS_ADDR,
    QUERY_DATA_ADDR,
    QUERY_MAX_ENDPOINTS,
    QUERY_SCAN_CACHE_BYTES,
)
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tools.bench.doget import MEMORY, SCAN, cpu_seconds, reference_server, scan_cache_lookups
from tools.bench.harness import (
    MIN_PAIRS_SHORT,
    QUICK_PAIRS,
    Figure,
    Samples,
    alternate,
    at_least,
    at_most,
    figure,
    measure,
    pairs_for,
    timed,
)
from tools.lake_testing.data import bulk_load
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query

WIDE = TableRef("bench", "wide")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("a", pa.float64()), ("b", pa.float64()), ("c", pa.int64())]
)
LOAD_WRITERS = 8
ROW_BYTES = 32
#: Two statements decoding and sending the same bytes, each another scan-cache entry.
FIRST_SCANS = ("SELECT * FROM bench.wide", "SELECT c, b, a, id FROM bench.wide")
GIB = 2**30
MIB = 2**20


def _rows(start: int, count: int) -> pa.RecordBatch:
    ids = np.arange(start, start + count, dtype=np.int64)
    rng = np.random.default_rng(start)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids),
            pa.array(rng.random(count)),
            pa.array(rng.random(count)),
            pa.array(ids % 1000),
        ],
        schema=SCHEMA,
    )


def _command(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


@contextmanager
def _lake(root: Path, scan_bytes: int) -> Iterator[tuple[LakeProcess, LakeProcess]]:
    meta = start_meta(root / "data", root)
    try:
        # One endpoint per query: every figure here measures a single stream
        # (partitioned scans have their own benchmark, partitions_bench).
        # Lake's DoGet goes through the native data plane, as a client following the
        # endpoint location would. The scan cache holds one full scan, not two.
        env = {
            QUERY_MAX_ENDPOINTS: "1",
            QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}",
            QUERY_SCAN_CACHE_BYTES: str(scan_bytes * 3 // 2),
            METRICS_ADDR: f"127.0.0.1:{free_port()}",
        }
        query = start_query(meta.addr, root, env=env)
        try:
            yield meta, query
        finally:
            query.stop()
    finally:
        meta.stop()


def _load(meta: LakeProcess, rows: int) -> int:
    """Load ``rows`` rows, optimize, and return the Lance version every figure reads."""
    began = time.perf_counter()
    bulk_load(meta.addr, WIDE, SCHEMA, rows, _rows, writers=LOAD_WRITERS)
    print(f"# bench.wide loaded in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return _optimize(meta)


def _optimize(meta: LakeProcess) -> int:
    """What an operator does after a bulk load, through the same admin calls.

    Compaction merges the one-fragment-per-append layout; the BTREE index on
    ``id`` serves the key lookups below. Query picks the new Lance version up
    through its catalog refresh.
    """

    async def optimize() -> int:
        async with MetaClient(f"http://{meta.addr}", timeout_s=600) as admin:
            compacted = await admin.optimize_table(WIDE)
            indexed = await admin.create_index(WIDE, "id")
            print(
                f"# bench.wide optimized: fragments {compacted.fragments_before} -> "
                f"{compacted.fragments_after}, indexes {indexed.indexes}, "
                f"Lance version {indexed.descriptor.engine_version}",
                file=sys.stderr,
                flush=True,
            )
            return int(indexed.descriptor.engine_version)

    version = asyncio.run(optimize())
    time.sleep(2.5)  # > Query's 1 s catalog refresh: every figure reads the optimized version
    return version


#: Clients of the endpoint locations Query named (its data plane), by URI.
_LOCATED: dict[str, flight.FlightClient] = {}


def _sql(client: flight.FlightClient, sql: str) -> pa.Table:
    info = client.get_flight_info(_command(sql))
    endpoint = info.endpoints[0]
    if endpoint.locations:
        uri = endpoint.locations[0].uri.decode()
        client = _LOCATED.get(uri) or _LOCATED.setdefault(uri, flight.FlightClient(uri))
    return client.do_get(endpoint.ticket).read_all()


def run(quick: bool) -> list[Figure]:
    doget_rows = 1 << 20 if quick else 1 << 24  # 4 x 8 bytes: 32 MiB quick, 512 MiB full
    group_rows = 500_000 if quick else 4_000_000
    pairs = pairs_for(quick)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
        root = Path(tmp)
        with _lake(root, doget_rows * ROW_BYTES) as (meta, query):
            version = _load(meta, doget_rows)
            client = flight.FlightClient(f"grpc+tcp://{query.addr}")
            dataset_uri = str(root / "data" / "tables" / "bench" / "wide.lance")
            dataset = lance.dataset(dataset_uri, version=version)
            # At least 15 pairs whatever a sample lasts under load: the figure in dispute.
            doget_pairs = QUICK_PAIRS if quick else MIN_PAIRS_SHORT
            figures += _doget(client, query, dataset_uri, version, root, doget_pairs)
            figures.append(_group_by(client, dataset, group_rows, quick, pairs))
            lookups = QUICK_PAIRS if quick else 31  # cheap samples: more pairs than the minimum
            figures.append(_random_access(client, dataset, doget_rows, lookups))
            figures.append(_point_query_latency(client, dataset, doget_rows, pairs))
            client.close()
            for located in _LOCATED.values():
                located.close()
            _LOCATED.clear()
    return figures


def _metrics_port(query: LakeProcess) -> int:
    return int(query.env[METRICS_ADDR].rsplit(":", 1)[1])


def _doget(
    client: flight.FlightClient,
    query: LakeProcess,
    dataset_uri: str,
    version: int,
    root: Path,
    pairs: int | None,
) -> list[Figure]:
    served = _sql(client, FIRST_SCANS[0])
    nbytes = served.nbytes
    print(
        f"# DoGet: {served.num_rows} rows, {nbytes / MIB:.0f} MiB, "
        f"{served.to_batches()[0].num_rows}-row batches",
        file=sys.stderr,
        flush=True,
    )
    cpu: dict[str, list[float]] = {"lake": [], "scan": [], "repeat": [], "memory": []}
    with reference_server(dataset_uri, version, served, root) as reference:
        del served

        def sample(side: str, pid: int, fetch: Callable[[], pa.Table]) -> float:
            before = cpu_seconds(pid)
            began = time.perf_counter()
            got = fetch()
            elapsed = time.perf_counter() - began
            cpu[side].append((cpu_seconds(pid) - before) / (nbytes / GIB))
            assert got.nbytes == nbytes
            return nbytes / MIB / elapsed

        first_scans = 0

        def first_scan() -> pa.Table:
            # Never a hit: the other column order evicted this one (checked below).
            nonlocal first_scans
            first_scans += 1
            return _sql(client, FIRST_SCANS[first_scans % 2])

        before = scan_cache_lookups(_metrics_port(query))
        samples = alternate(
            {
                "lake": lambda: sample("lake", query.pid, first_scan),
                "scan": lambda: sample(
                    "scan", reference.pid, lambda: reference.client.do_get(SCAN).read_all()
                ),
                "memory": lambda: sample(
                    "memory", reference.pid, lambda: reference.client.do_get(MEMORY).read_all()
                ),
            },
            pairs=pairs,
        )
        after = scan_cache_lookups(_metrics_port(query))
        if after["hits"] != before["hits"] or after["admitted"] - before["admitted"] != first_scans:
            raise AssertionError(f"first scans were not all kept misses: {before} -> {after}")
        print(f"# first scans: {first_scans} misses kept, no hit", file=sys.stderr, flush=True)
        cpu["memory"].clear()
        repeated = _repeat_scan(client, query, reference, sample, pairs)
    kept = len(samples["lake"])
    lake_cpu, scan_cpu = cpu["lake"][-kept:], cpu["scan"][-kept:]  # warm-up dropped
    again = len(repeated["lake"])
    repeat_cpu, memory_cpu = cpu["repeat"][-again:], cpu["memory"][-again:]
    return [
        figure(
            "doget_pinned_table",
            samples["lake"],
            samples["scan"],
            unit="MiB/s",
            goal=at_least(
                1.0, ">= 1.0 of pyarrow's C++ Flight server streaming the same Lance scan"
            ),
            load_1m=samples.load_1m,
        ),
        figure(
            "doget_server_cpu_per_gib",
            lake_cpu,
            scan_cpu,
            unit="CPU s/GiB",
            goal=at_most(1.2, "<= 1.2x the C++ server's CPU per GiB on the same Lance scan"),
            load_1m=samples.load_1m,
        ),
        figure(
            "doget_vs_memory",
            samples["lake"],
            samples["memory"],
            unit="MiB/s",
            goal=None,
            report_only="report: against the C++ server sending the same rows from memory",
            load_1m=samples.load_1m,
        ),
        figure(
            "doget_repeat_scan",
            repeated["lake"],
            repeated["memory"],
            unit="MiB/s",
            goal=at_least(
                0.9, ">= 0.9 of pyarrow's C++ Flight server sending the same rows from memory"
            ),
            load_1m=repeated.load_1m,
        ),
        figure(
            "doget_repeat_scan_cpu_per_gib",
            repeat_cpu,
            memory_cpu,
            unit="CPU s/GiB",
            goal=at_most(1.5, "<= 1.5x the C++ server's CPU per GiB sending from memory"),
            load_1m=repeated.load_1m,
        ),
    ]


def _repeat_scan(
    client: flight.FlightClient,
    query: LakeProcess,
    reference: Any,
    sample: Callable[[str, int, Callable[[], pa.Table]], float],
    pairs: int | None,
) -> Samples:
    """The same pinned scan again and again (a training epoch), against the C++ server's
    memory: every Lake sample after the warm-up is a scan-cache hit (checked)."""
    sql = FIRST_SCANS[0]
    _sql(client, sql)  # kept now, if the last first scan was the other column order
    before = scan_cache_lookups(_metrics_port(query))
    repeated = alternate(
        {
            "lake": lambda: sample("repeat", query.pid, lambda: _sql(client, sql)),
            "memory": lambda: sample(
                "memory", reference.pid, lambda: reference.client.do_get(MEMORY).read_all()
            ),
        },
        pairs=pairs,
    )
    after = scan_cache_lookups(_metrics_port(query))
    rounds = len(repeated["lake"]) + 1  # and the warm-up round's
    if after["hits"] - before["hits"] != rounds or after["misses"] != before["misses"]:
        raise AssertionError(f"repeated scans were not all hits: {before} -> {after}")
    print(f"# repeated scans: {rounds} hits", file=sys.stderr, flush=True)
    return repeated


def _group_by(
    client: flight.FlightClient, dataset: Any, group_rows: int, quick: bool, pairs: int | None
) -> Figure:
    sql = (
        f"SELECT c % 100 AS g, count(*) AS n, sum(a) AS sa, avg(b) AS ab "
        f"FROM bench.wide WHERE id < {group_rows} GROUP BY c % 100"
    )
    ctx = SessionContext()
    ctx.register_table("wide", lance.FFILanceTableProvider(dataset))
    local_sql = sql.replace("bench.wide", "wide")
    return measure(
        "group_by_500k_rows" if quick else "group_by_4m_rows",
        lambda: timed(lambda: _sql(client, sql)) * 1000,
        lambda: timed(lambda: ctx.sql(local_sql).collect()) * 1000,
        unit="ms",
        goal=at_most(1.1, "<= 1.1x in-process DataFusion"),
        pairs=pairs,
    )


class _Keys:
    """The same key sets for both sides of each pair: call ``n`` of a side gets set ``n``."""

    def __init__(self, rows: int, per_call: int, seed: int) -> None:
        self.rows, self.per_call, self.seed = rows, per_call, seed
        self.calls: dict[str, int] = {}

    def next(self, side: str) -> list[int]:
        n = self.calls.get(side, 0)
        self.calls[side] = n + 1
        rng = np.random.default_rng((self.seed, n))
        return sorted(int(k) for k in rng.choice(self.rows, size=self.per_call, replace=False))


def _index_used(dataset: Any, columns: list[str], row_filter: str) -> None:
    plan = dataset.scanner(columns=columns, filter=row_filter).explain_plan()
    if "ScalarIndexQuery" not in plan:
        raise AssertionError(f"the reference does not use the scalar index:\n{plan}")


def _random_access(client: flight.FlightClient, dataset: Any, rows: int, pairs: int) -> Figure:
    """30 random rows by key through Lake, against the same filter on in-process Lance."""
    keys = _Keys(rows, 30, seed=7)
    _index_used(dataset, SCHEMA.names, "id IN (1, 2)")

    def lake() -> float:
        wanted = ", ".join(map(str, keys.next("lake")))

        def go() -> None:
            assert _sql(client, f"SELECT * FROM bench.wide WHERE id IN ({wanted})").num_rows == 30

        return timed(go) * 1000

    def reference() -> float:
        wanted = ", ".join(map(str, keys.next("reference")))

        def go() -> None:
            got = dataset.scanner(columns=SCHEMA.names, filter=f"id IN ({wanted})").to_table()
            assert got.num_rows == 30

        return timed(go) * 1000

    return measure(
        "random_access_30_rows",
        lake,
        reference,
        unit="ms",
        goal=at_most(2.0, "<= 2x the in-process key lookup through the same index"),
        pairs=pairs,
    )


def _point_query_latency(
    client: flight.FlightClient, dataset: Any, rows: int, pairs: int | None
) -> Figure:
    """p50 of ``SELECT id, a, c ... WHERE id = k`` through Lake, against in-process Lance."""
    per_sample = 15
    keys = _Keys(rows, per_sample, seed=11)
    columns = ["id", "a", "c"]
    _index_used(dataset, columns, "id = 1")

    def p50(side: str, run_one: Callable[[int], None]) -> float:
        times = sorted(timed(partial(run_one, k)) for k in keys.next(side))
        return times[len(times) // 2] * 1000

    def lake_one(key: int) -> None:
        assert _sql(client, f"SELECT id, a, c FROM bench.wide WHERE id = {key}").num_rows == 1

    def ref_one(key: int) -> None:
        assert dataset.scanner(columns=columns, filter=f"id = {key}").to_table().num_rows == 1

    return measure(
        "point_query_p50",
        lambda: p50("lake", lake_one),
        lambda: p50("reference", ref_one),
        unit="ms",
        goal=at_most(5.0, "p50 <= +5 ms over the in-process Lance scan", scale="difference"),
        pairs=pairs,
    )
