"""DoGet's references: pyarrow's C++ Flight server, in its own process, on the same rows.

One server answers two tickets:

- ``scan``: a fresh Lance scanner over the same pinned version Lake serves,
  at the batch size Lake streamed (``RecordBatchStream`` over the scanner's
  reader: Lance decodes, the C++ server encodes and sends, no Python per batch);
- ``memory``: the same rows, already decoded into memory, in the same batches.

Both sides' server CPU (utime + stime of the serving process, from
``/proc``) is read around each request for the CPU-per-GiB figure.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight

__all__ = [
    "MEMORY",
    "SCAN",
    "ReferenceServer",
    "cpu_seconds",
    "reference_server",
    "scan_cache_lookups",
]

SCAN = flight.Ticket(b"scan")
MEMORY = flight.Ticket(b"memory")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process ``pid`` has used so far (all its threads)."""
    # Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scan_cache_lookups(metrics_port: int) -> dict[str, float]:
    """A Query process's scan-cache counters from its /metrics: hits, misses, fills admitted."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    wanted = {
        'lake_query_scan_cache_lookups_total{result="hit"}': "hits",
        'lake_query_scan_cache_lookups_total{result="miss"}': "misses",
        'lake_query_scan_cache_fills_total{outcome="admitted"}': "admitted",
    }
    found = {}
    for line in text.splitlines():
        sample, _, number = line.rpartition(" ")
        if sample in wanted:
            found[wanted[sample]] = float(number)
    return found


def _serve(
    dataset_uri: str,
    version: int,
    batch_rows: int,
    ipc_path: str,
    ports: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    import lance

    dataset = lance.dataset(dataset_uri, version=version)
    in_memory = pa.ipc.open_file(ipc_path).read_all()
    columns = dataset.schema.names

    class Server(flight.FlightServerBase):  # type: ignore[misc]
        def do_get(self, context: object, ticket: flight.Ticket) -> flight.RecordBatchStream:
            if ticket.ticket == SCAN.ticket:
                scanner = dataset.scanner(columns=columns, batch_size=batch_rows)
                return flight.RecordBatchStream(scanner.to_reader())
            return flight.RecordBatchStream(in_memory)

    server = Server("grpc+tcp://127.0.0.1:0")
    ports.put(server.port)
    server.serve()


class ReferenceServer:
    """The running reference process: its client and its pid."""

    def __init__(self, process: multiprocessing.process.BaseProcess, port: int) -> None:
        self.process = process
        self.client = flight.FlightClient(f"grpc+tcp://127.0.0.1:{port}")

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid


@contextmanager
def reference_server(
    dataset_uri: str, version: int, served: pa.Table, root: Path
) -> Iterator[ReferenceServer]:
    """Start the reference for Lance ``version`` of ``dataset_uri``.

    ``served`` is the table as Lake streamed it: its first batch gives the
    batch size, and its batches are the in-memory reference's.
    """
    batch_rows = served.to_batches()[0].num_rows
    ipc_path = root / "reference.arrow"
    with pa.ipc.new_file(str(ipc_path), served.schema) as writer:
        writer.write_table(served, max_chunksize=batch_rows)
    ctx = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    process = ctx.Process(
        target=_serve, args=(dataset_uri, version, batch_rows, str(ipc_path), ports), daemon=True
    )
    process.start()
    try:
        server = ReferenceServer(process, ports.get(timeout=120))
        try:
            yield server
        finally:
            server.client.close()
    finally:
        process.terminate()
        process.join(10)
        ipc_path.unlink(missing_ok=True)
