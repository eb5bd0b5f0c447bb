"""Durable async export against interactive DoGet on the same replica, same run.

``async_export``: a 4-million-row, 4-column result (``bench.wide``) through
submit -> poll -> DoGet of every part (the SDK's ``submit_async``,
``poll_async`` and part streams), against the same SQL through one
interactive GetFlightInfo + DoGet on the same Query replica. Both sides read
every batch to the client. Figure: async rows/s over interactive rows/s.
Goal: >= 0.8 (the async side also encodes, stores and re-reads its parts).

What bounds it (2 shared cores; the result is 128 MB in two parts; Query's
CPU per run, 2026-12-02). The interactive run executes, encodes and sends
once: 0.10-0.12 CPU-s. The durable run executes and encodes to storage,
with a write, an early writeback and an fsync per part, then the job's
record updates (0.17-0.19 CPU-s from submit to done), and then reads the
parts back and sends them (about 0.08 CPU-s). Storing alone costs more than
the whole interactive run, so >= 0.8 is out of reach on two cores while
every part is durable and verified. This round: 0.37 -> 0.27 CPU-s per
durable run by tagging parts with Poly1305 instead of SHA-256 (a third of the
CPU had been hashing, at write and again at serve;
:mod:`lake_query.jobs.tags`), and thread switches per run 8,200 -> 4,000 by
waking each end of the part channel only at its boundary.

``async_export_first_batch_ms``: from the poll that reports ``done`` to the
first batch of the first part in the client. Goal: p50 <= 50 ms (a bound,
not a measured reference).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.flight as flight

import lake_sdk
from lake_core.config import QUERY_MAX_ENDPOINTS
from tools.bench.harness import Figure, at_least, at_most, machine, measure, pairs_for, warmup_for
from tools.bench.query_bench import _command, _load
from tools.lake_testing.servers import LakeProcess, start_meta, start_query

SQL = "SELECT id, a, b, c FROM bench.wide"
ENV = {
    "LAKE_ASYNC_QUERIES": "true",
    "LAKE_ASYNC_MAX_OUTSTANDING_PER_TENANT": "128",
    # The interactive reference is one DoGet stream: the full-size table would split.
    QUERY_MAX_ENDPOINTS: "1",
}


@contextmanager
def _lake(root: Path) -> Iterator[tuple[LakeProcess, LakeProcess]]:
    meta = start_meta(root / "data", root)
    try:
        query = start_query(meta.addr, root, env=ENV, extra_args=("--data-dir", str(root / "data")))
        try:
            yield meta, query
        finally:
            query.stop()
    finally:
        meta.stop()


def _drain(reader: flight.FlightStreamReader) -> tuple[int, float | None]:
    """Rows read, and when the first batch arrived (perf_counter)."""
    rows, first = 0, None
    for chunk in reader:
        if first is None:
            first = time.perf_counter()
        rows += chunk.data.num_rows
    return rows, first


def run(quick: bool) -> list[Figure]:
    rows = 200_000 if quick else 4_000_000
    with (
        tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp,
        _lake(Path(tmp)) as (meta, query),
    ):
        _load(meta, rows)
        first_batch_ms: list[float] = []
        with (
            lake_sdk.Client(query.url) as sdk,
            flight.FlightClient(f"grpc+tcp://{query.addr}") as raw,
        ):

            def durable() -> float:
                began = time.perf_counter()
                handle = sdk.submit_async(SQL)
                while handle.state not in ("done", "failed", "cancelled"):
                    time.sleep(0.005)
                    handle = sdk.poll_async(handle)
                if handle.state != "done":
                    raise RuntimeError(f"async export ended {handle.state}: {handle.error}")
                done_at = time.perf_counter()
                got = 0
                for index, ticket in enumerate(handle._endpoints):
                    count, first = _drain(raw.do_get(flight.Ticket(ticket)))
                    if index == 0 and first is not None:
                        first_batch_ms.append(1000 * (first - done_at))
                    got += count
                elapsed = time.perf_counter() - began
                sdk.cancel_async(handle)  # release its slot and parts
                assert got == rows, f"async export returned {got} of {rows} rows"
                return got / elapsed

            def interactive() -> float:
                began = time.perf_counter()
                info = raw.get_flight_info(_command(SQL))
                count, _ = _drain(raw.do_get(info.endpoints[0].ticket))
                assert count == rows
                return count / (time.perf_counter() - began)

            throughput = measure(
                "async_export",
                durable,
                interactive,
                unit="rows/s",
                goal=at_least(0.8, ">= 0.8 of interactive DoGet throughput"),
                pairs=pairs_for(quick),
                warmup=warmup_for(quick),
            )
            print(f"# async first-batch samples: {len(first_batch_ms)}", file=sys.stderr)
            samples = iter(list(first_batch_ms))
            first = measure(
                "async_export_first_batch_ms",
                lambda: next(samples),
                lambda: 50.0,
                unit="ms",
                goal=at_most(1.0, "time to first batch after completion, p50 <= 50 ms"),
                pairs=len(first_batch_ms),  # every async sample above, warm-up included
                warmup=0,
                reference_kind="bound",
            )
    return [throughput, first]


if __name__ == "__main__":
    print(machine())
    for figure in run(quick=False):
        print(figure.json())
