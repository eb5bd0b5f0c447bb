"""A listen address another server holds is refused, by name, and the holder keeps it."""

from __future__ import annotations

import socket

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lake_core.errors import ConfigError
from lake_core.flight.binding import ensure_address_free
from lake_core.flight.server import FlightHandler, FlightServer


class Nothing(FlightHandler):
    pass


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0.0.0.0"])
async def test_a_second_server_on_a_busy_port_is_refused(host: str) -> None:
    first = FlightServer(Nothing())
    port = await first.start("127.0.0.1:0")
    second = FlightServer(Nothing())
    try:
        with pytest.raises(ConfigError, match=f"{host}:{port}.*already in use"):
            await second.start(f"{host}:{port}")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await first.shutdown(0.1)


def test_the_probe_sees_a_plain_listener_and_ignores_port_zero() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            ensure_address_free(f"127.0.0.1:{port}")
    ensure_address_free("127.0.0.1:0")
    ensure_address_free(f"127.0.0.1:{port}")  # released again
