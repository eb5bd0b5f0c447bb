"""A real OTLP/gRPC trace receiver for tests: no collector binary needed.

Lake processes export to it with the standard OTLP exporter
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:PORT``); tests wait
for the spans they expect with :meth:`OtlpReceiver.wait_for`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = ["OtlpReceiver", "ReceivedSpan", "receiver_process"]


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    return (
        getattr(any_value, any_value.WhichOneof("value")) if any_value.WhichOneof("value") else None
    )


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self.receiver._changed:
            self.receiver.spans.extend(received)
            self.receiver._changed.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._changed = threading.Condition()
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 30.0
    ) -> list[ReceivedSpan]:
        """Block until ``done(spans)`` holds (woken by each export), or fail."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not done(list(self.spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"spans never arrived; got {self.spans}")
                self._changed.wait(left)
            return list(self.spans)


@contextmanager
def receiver_process() -> Iterator[str]:
    """An OTLP receiver in a child process; yields its endpoint, stops it by pid on exit.

    For benchmarks: a receiver in the measuring process would decode every
    export on that process's GIL, while it is also the client being timed.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "tools.lake_testing.otlp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        endpoint = child.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            raise RuntimeError(f"the OTLP receiver did not start (exit {child.poll()})")
        yield endpoint
    finally:
        child.terminate()
        child.wait(timeout=10)


if __name__ == "__main__":
    # A receiver until stdin closes or SIGTERM (see receiver_process).
    receiver = OtlpReceiver().start()
    print(receiver.endpoint, flush=True)
    try:
        sys.stdin.read()
    finally:
        receiver.stop()
