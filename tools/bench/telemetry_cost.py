"""What one RPC's telemetry costs in process: ``python -m tools.bench.telemetry_cost``.

Times the work the Flight server base does around every call
(:class:`lake_core.telemetry.rpc.RpcObservation` opened and closed: metrics,
the server span, the request id) with tracing off and on, with and without an
incoming ``traceparent``. "On" is the production setup: the SDK provider
from ``configure_tracing`` with its bounded batch exporter sending OTLP/gRPC
to a receiver in a child process (as the telemetry benchmark's receiver is
in another process than Query).

Two figures per case, CPU microseconds per RPC: ``rpc``, the call's own
thread (a block of calls smaller than one export batch, so the exporter
thread stays asleep), and ``export``, the exporter thread's CPU time to
encode and send those spans (a flush). The least of the blocks is the
figure (the cost with the least interference from a busy machine), the
median beside it. Not a harness figure (no replica pair): a tool for
finding where the microseconds go.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from lake_core.telemetry.rpc import RpcObservation
from lake_core.telemetry.tracing import MAX_BATCH, OTLP_TRACES_ENDPOINT, configure_tracing

METHOD = "/arrow.flight.protocol.FlightService/GetFlightInfo"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BASE_METADATA = (("authorization", "Bearer x"), ("user-agent", "grpc-python/1.85"))
RECEIVER = (
    "import sys; from tools.lake_testing.otlp import OtlpReceiver; r = OtlpReceiver().start(); "
    "print(r.endpoint, flush=True); sys.stdin.read(); r.stop()"
)


class _Context:
    """The two ServicerContext calls RpcObservation makes."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def code(self) -> None:
        return None


def one_rpc(context: _Context) -> None:
    RpcObservation(METHOD, context, counted=True).close(None, context)


def _block(context: _Context, calls: int, flush: Callable[[], Any]) -> tuple[float, float]:
    """(RPC-thread us, exporter CPU us) per call over one block."""
    began = time.thread_time()  # this thread's CPU: robust to a busy machine's preemption
    for _ in range(calls):
        one_rpc(context)
    rpc = time.thread_time() - began
    cpu = time.process_time()
    flush()
    return 1e6 * rpc / calls, 1e6 * (time.process_time() - cpu) / calls


def _measure(
    label: str, context: _Context, calls: int, repeats: int, flush: Callable[[], Any]
) -> None:
    _block(context, calls, flush)  # warm
    rpcs, exports = zip(*(_block(context, calls, flush) for _ in range(repeats)), strict=True)
    print(
        f"{label:<22} rpc {min(rpcs):6.1f} us (median {statistics.median(rpcs):6.1f})   "
        f"export {min(exports):6.1f} us (median {statistics.median(exports):6.1f})   "
        f"(least of {repeats} x {calls})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="telemetry_cost")
    parser.add_argument("--calls", type=int, default=MAX_BATCH - 12)
    parser.add_argument("--repeats", type=int, default=25)
    args = parser.parse_args()
    plain = _Context(BASE_METADATA)
    parented = _Context((*BASE_METADATA, ("traceparent", TRACEPARENT)))

    def nothing() -> None:
        return None

    _measure("off, no traceparent", plain, args.calls, args.repeats, nothing)
    _measure("off, traceparent", parented, args.calls, args.repeats, nothing)
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout is not None
        endpoint = receiver.stdout.readline().strip()
        tracing = configure_tracing("telemetry-cost", {OTLP_TRACES_ENDPOINT: endpoint})
        assert tracing is not None
        flush = tracing.provider.force_flush
        _measure("on, no traceparent", plain, args.calls, args.repeats, flush)
        _measure("on, traceparent", parented, args.calls, args.repeats, flush)
        tracing.close()
    finally:
        assert receiver.stdin is not None
        receiver.stdin.close()
        receiver.wait(timeout=30)


if __name__ == "__main__":
    main()
