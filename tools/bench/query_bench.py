"""Query benchmarks: DoGet throughput and GROUP BY latency through Lake.

- ``doget_pinned_table``: a pinned Lance table of 4 numeric columns (200 MB in
  full mode) fetched through Lake Query, against pyarrow's C++ Flight server
  serving the same rows from memory in another process. Goal: >= 0.6.
- ``group_by_4m_rows``: a GROUP BY over 4 million rows through Lake (ticket,
  pinning and transfer included), against the same SQL run in-process by
  DataFusion on the same Lance version. Goal: <= 1.3x the latency.
- ``random_access_30_rows`` and ``point_query_p50``: key lookups on ``id``.

The table is loaded by 10,000-row appends, then optimized the way an operator
would (``optimize_table`` and a BTREE ``create_index`` on ``id`` through
Metasrv), so every figure measures the compacted, indexed table; the
in-process references open the same (latest) Lance version.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from datafusion import SessionContext
from google.protobuf import any_pb2

import lake_sdk
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from tools.bench.harness import Figure, measure, timed
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

WIDE = TableRef("bench", "wide")
SCHEMA = pa.schema(
    [("id", pa.int64()), ("a", pa.float64()), ("b", pa.float64()), ("c", pa.int64())]
)
APPEND_ROWS = 10_000


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
def _lake(root: Path) -> Iterator[tuple[LakeProcess, LakeProcess]]:
    meta = start_meta(root / "data", root)
    try:
        query = start_query(meta.addr, root)
        try:
            yield meta, query
        finally:
            query.stop()
    finally:
        meta.stop()


def _load(meta: LakeProcess, query: LakeProcess, rows: int) -> None:
    async def create() -> None:
        async with MetaClient(f"http://{meta.addr}") as admin:
            await admin.create_table(WIDE, SCHEMA)

    asyncio.run(create())
    with lake_sdk.connect(query.url) as client:
        for start in range(0, rows, APPEND_ROWS):
            client.append_batches(WIDE, [_rows(start, min(APPEND_ROWS, rows - start))])
    _optimize(meta)


def _optimize(meta: LakeProcess) -> None:
    """What an operator does after a bulk load, through the same admin calls.

    Compaction merges the one-fragment-per-append layout (Metasrv's
    background compactor may already have merged part of it); the BTREE
    index on ``id`` serves the key lookups below. Query picks the new Lance
    version up through its catalog refresh.
    """

    async def optimize() -> str:
        async with MetaClient(f"http://{meta.addr}", timeout_s=600) as admin:
            compacted = await admin.optimize_table(WIDE)
            indexed = await admin.create_index(WIDE, "id")
            return (
                f"fragments {compacted.fragments_before} -> {compacted.fragments_after}, "
                f"indexes {indexed.indexes}, Lance version {indexed.descriptor.engine_version}"
            )

    print(f"# bench.wide optimized: {asyncio.run(optimize())}", file=sys.stderr, flush=True)
    time.sleep(2.5)  # > Query's 1 s catalog refresh: every figure reads the optimized version


def _reference_server(table_path: str, port_queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    table = pa.ipc.open_file(table_path).read_all()

    class Server(flight.FlightServerBase):
        def do_get(self, context: object, ticket: flight.Ticket) -> flight.RecordBatchStream:
            return flight.RecordBatchStream(table)

    server = Server("grpc+tcp://127.0.0.1:0")
    port_queue.put(server.port)
    server.serve()


def run(quick: bool) -> list[Figure]:
    doget_rows = 1_000_000 if quick else 6_250_000  # 4 x 8 bytes: 32 MB quick, 200 MB full
    group_rows = 500_000 if quick else 4_000_000
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
        root = Path(tmp)
        with _lake(root) as (meta, query):
            _load(meta, query, doget_rows)
            client = flight.FlightClient(f"grpc+tcp://{query.addr}")
            dataset_uri = str(root / "data" / "tables" / "bench" / "wide.lance")

            # --- DoGet throughput --------------------------------------
            full = client.do_get(
                client.get_flight_info(_command("SELECT * FROM bench.wide")).endpoints[0].ticket
            ).read_all()
            nbytes = full.nbytes
            ipc_path = root / "reference.arrow"
            with pa.ipc.new_file(str(ipc_path), full.schema) as writer:
                writer.write_table(full.combine_chunks(), max_chunksize=65_536)
            ctx = multiprocessing.get_context("spawn")
            ports: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
            ref_proc = ctx.Process(
                target=_reference_server, args=(str(ipc_path), ports), daemon=True
            )
            ref_proc.start()
            try:
                ref_client = flight.FlightClient(f"grpc+tcp://127.0.0.1:{ports.get(timeout=60)}")

                def lake_doget() -> float:
                    def go() -> None:
                        info = client.get_flight_info(_command("SELECT * FROM bench.wide"))
                        client.do_get(info.endpoints[0].ticket).read_all()

                    return nbytes / 2**20 / timed(go)

                def ref_doget() -> float:
                    return (
                        nbytes
                        / 2**20
                        / timed(lambda: ref_client.do_get(flight.Ticket(b"t")).read_all())
                    )

                figures.append(
                    measure(
                        "doget_pinned_table",
                        lake_doget,
                        ref_doget,
                        unit="MiB/s",
                        goal=">= 0.6 of pyarrow C++ Flight server",
                        ratio_of=lambda lake, ref: lake / ref,
                        met=lambda lake, ref, ratio: ratio >= 0.6,
                        threshold=lambda lake, ref: 0.6,
                    )
                )
                ref_client.close()
            finally:
                ref_proc.terminate()
                ref_proc.join(10)

            # --- GROUP BY latency --------------------------------------
            sql = (
                f"SELECT c % 100 AS g, count(*) AS n, sum(a) AS sa, avg(b) AS ab "
                f"FROM bench.wide WHERE id < {group_rows} GROUP BY c % 100"
            )
            dataset = lance.dataset(dataset_uri)
            df_ctx = SessionContext()
            df_ctx.register_table("wide", lance.FFILanceTableProvider(dataset))
            local_sql = sql.replace("bench.wide", "wide")

            def lake_group() -> float:
                def go() -> None:
                    info = client.get_flight_info(_command(sql))
                    client.do_get(info.endpoints[0].ticket).read_all()

                return timed(go) * 1000

            def ref_group() -> float:
                return timed(lambda: df_ctx.sql(local_sql).collect()) * 1000

            figures.append(
                measure(
                    "group_by_4m_rows" if not quick else "group_by_500k_rows",
                    lake_group,
                    ref_group,
                    unit="ms",
                    goal="<= 1.3x in-process DataFusion",
                    ratio_of=lambda lake, ref: lake / ref,
                    met=lambda lake, ref, ratio: ratio <= 1.3,
                    threshold=lambda lake, ref: 1.3,
                )
            )
            figures.append(_random_access(client, dataset, doget_rows))
            figures.append(_point_query_latency(client, df_ctx, doget_rows))
            client.close()
    return figures


def _random_access(client: flight.FlightClient, dataset: object, rows: int) -> Figure:
    """30 random rows by a key filter through Lake, against ``dataset.take``."""
    rng = np.random.default_rng(7)

    def keys() -> list[int]:
        return sorted(int(k) for k in rng.choice(rows, size=30, replace=False))

    def lake() -> float:
        wanted = keys()
        sql = f"SELECT * FROM bench.wide WHERE id IN ({', '.join(map(str, wanted))})"

        def go() -> None:
            info = client.get_flight_info(_command(sql))
            got = client.do_get(info.endpoints[0].ticket).read_all()
            assert got.num_rows == 30

        return timed(go) * 1000

    def reference() -> float:
        wanted = keys()
        return timed(lambda: dataset.take(wanted)) * 1000  # type: ignore[attr-defined]

    return measure(
        "random_access_30_rows",
        lake,
        reference,
        unit="ms",
        goal="<= 2x dataset.take, or <= +5 ms",
        ratio_of=lambda lake, ref: lake / ref,
        met=lambda lake, ref, ratio: ratio <= 2 or lake - ref <= 5,
        threshold=lambda lake, ref: max(2.0, (ref + 5) / ref),
        runs=9,
    )


def _point_query_latency(client: flight.FlightClient, ctx: SessionContext, rows: int) -> Figure:
    """p50 of ``SELECT ... WHERE id = k`` through Lake, against in-process DataFusion."""
    rng = np.random.default_rng(11)
    samples = 15

    def p50(run_one: Callable[[int], None]) -> float:
        times = sorted(timed(lambda: run_one(int(rng.integers(rows)))) for _ in range(samples))
        return times[len(times) // 2] * 1000

    def lake_one(key: int) -> None:
        info = client.get_flight_info(_command(f"SELECT id, a, c FROM bench.wide WHERE id = {key}"))
        assert client.do_get(info.endpoints[0].ticket).read_all().num_rows == 1

    def ref_one(key: int) -> None:
        assert ctx.sql(f"SELECT id, a, c FROM wide WHERE id = {key}").to_arrow_table().num_rows == 1

    return measure(
        "point_query_p50",
        lambda: p50(lake_one),
        lambda: p50(ref_one),
        unit="ms",
        goal="<= in-process DataFusion + 15 ms",
        ratio_of=lambda lake, ref: lake / ref,
        met=lambda lake, ref, ratio: lake - ref <= 15,
        threshold=lambda lake, ref: (ref + 15) / ref,
    )
