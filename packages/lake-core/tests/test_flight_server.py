"""The grpc.aio Flight scaffolding, exercised with pyarrow's own FlightClient.

pyarrow's client is blocking, so every client call runs in a worker thread
while the server runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
import pyarrow as pa
import pyarrow.flight as fl
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lake_core.errors import ConfigError, InvalidArgument, Unauthenticated
from lake_core.flight.encoding import FlightDataDecoder, encode_batch, encode_stream
from lake_core.flight.server import (
    FLIGHT_SERVICE,
    FlightHandler,
    FlightServer,
    UncleanShutdown,
    current_principal,
    serve,
    shutdown_grace_ms,
)
from lake_core.proto import flight_pb2 as pb

T = TypeVar("T")


def _many_types_table() -> pa.Table:
    def batch(i: int) -> pa.RecordBatch:
        return pa.record_batch(
            {
                "i8": pa.array([i, -1, None], pa.int8()),
                "i64": pa.array([i * 10**12, 0, None], pa.int64()),
                "u32": pa.array([i, 2**32 - 1, None], pa.uint32()),
                "f32": pa.array([1.5, float("inf"), None], pa.float32()),
                "f64": pa.array([i / 3, -0.0, None], pa.float64()),
                "s": pa.array([f"row{i}", "é", None], pa.string()),
                "ls": pa.array(["x" * i, "", None], pa.large_string()),
                "b": pa.array([True, False, None], pa.bool_()),
                "ts": pa.array(
                    [
                        dt.datetime(2024, 1, 1 + i, tzinfo=dt.UTC),
                        None,
                        dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
                    ],
                    pa.timestamp("us", "UTC"),
                ),
                "d32": pa.array([dt.date(2020, 2, 29), None, dt.date(1, 1, 1)], pa.date32()),
                "bin": pa.array([b"\x00\xff", b"", None], pa.binary()),
                "st": pa.array(
                    [{"a": i, "b": "x"}, None, {"a": None, "b": None}],
                    pa.struct([("a", pa.int32()), ("b", pa.string())]),
                ),
                "l": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
                # Different dictionary per batch: replacement dictionaries.
                "dict": pa.array([f"k{i}", "common", None]).dictionary_encode(),
            }
        )

    batches = [batch(i) for i in range(4)]
    schema = batches[0].schema.with_metadata({"origin": "lake-test"})
    batches = [b.replace_schema_metadata(schema.metadata) for b in batches]
    return pa.Table.from_batches(batches, schema)


Put = tuple[pb.FlightDescriptor | None, pa.Schema, list[pa.RecordBatch], list[bytes]]


class Panic(BaseException):
    """What pyo3 raises for a Rust panic (Lance's): a BaseException, not an Exception."""


class ToyHandler(FlightHandler):
    """Serves named tables via DoGet and records what DoPut receives."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = tables
        self.puts: list[Put] = []
        self.principals: list[object | None] = []
        self.hanging = asyncio.Event()
        self.release = asyncio.Event()

    async def do_get(self, ticket: pb.Ticket, context: Any) -> AsyncIterator[bytes]:
        self.principals.append(current_principal())
        name = ticket.ticket.decode()
        if name == "hang":
            self.hanging.set()
            await self.release.wait()
            return
        if name == "whoami":
            await asyncio.sleep(0.05)  # let concurrent calls interleave
            batch = pa.record_batch({"who": [str(current_principal())]})
            for message in encode_stream(batch.schema, [batch]):
                yield message
            return
        if name == "boom":
            raise RuntimeError("secret internal detail")
        if name == "panic":
            raise Panic("a Rust panic's secret detail")
        if name == "with-metadata":
            batch = pa.record_batch({"x": [1, 2]})
            yield encode_stream(batch.schema, []).__next__()
            yield encode_batch(batch, app_metadata=b"first")
            yield encode_batch(batch, app_metadata=b"second")
            return
        table = self.tables[name]
        for message in encode_stream(table.schema, table.to_batches()):
            yield message

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Any
    ) -> AsyncIterator[pb.PutResult]:
        decoder = FlightDataDecoder(max_bytes=64 * 1024 * 1024)
        batches: list[pa.RecordBatch] = []
        async for message in messages:
            for batch in decoder.feed(message):
                batches.append(batch)
                yield pb.PutResult(app_metadata=b"ack:%d" % len(batches))
        assert decoder.schema is not None
        self.puts.append((decoder.descriptor, decoder.schema, batches, decoder.app_metadata))

    async def get_flight_info(self, descriptor: pb.FlightDescriptor, context: Any) -> pb.FlightInfo:
        name = "/".join(descriptor.path)
        if name not in self.tables:
            raise InvalidArgument(f"unknown table {name!r}")
        table = self.tables[name]
        return pb.FlightInfo(
            schema=table.schema.serialize().to_pybytes(),
            flight_descriptor=descriptor,
            endpoint=[pb.FlightEndpoint(ticket=pb.Ticket(ticket=name.encode()))],
            total_records=table.num_rows,
            total_bytes=-1,
        )

    async def do_action(self, action: pb.Action, context: Any) -> AsyncIterator[pb.Result]:
        for part in (b"did:", action.type.encode(), action.body):
            yield pb.Result(body=part)

    async def list_actions(self, context: Any) -> AsyncIterator[pb.ActionType]:
        yield pb.ActionType(type="echo", description="echoes the body")
        yield pb.ActionType(type="noop", description="")


@contextlib.asynccontextmanager
async def running(handler: FlightHandler, **kwargs: Any) -> AsyncIterator[tuple[FlightServer, str]]:
    server = FlightServer(handler, **kwargs)
    port = await server.start("127.0.0.1:0")
    try:
        yield server, f"grpc://127.0.0.1:{port}"
    finally:
        await server.shutdown(1.0)


async def in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


def _client(uri: str) -> fl.FlightClient:
    return fl.FlightClient(uri)


@pytest.mark.asyncio
async def test_do_get_many_types_roundtrip() -> None:
    table = _many_types_table()
    handler = ToyHandler({"t": table})
    async with running(handler) as (_, uri):

        def fetch() -> list[pa.RecordBatch]:
            with _client(uri) as client:
                return [chunk.data for chunk in client.do_get(fl.Ticket(b"t"))]

        batches = await in_thread(fetch)
    assert len(batches) == 4
    assert batches[0].schema == table.schema
    assert batches[0].schema.metadata == {b"origin": b"lake-test"}
    for got, want in zip(batches, table.to_batches(), strict=True):
        assert got.equals(want)
    assert pa.Table.from_batches(batches).equals(table)


@pytest.mark.asyncio
async def test_do_get_app_metadata() -> None:
    async with running(ToyHandler({})) as (_, uri):

        def fetch() -> list[bytes | None]:
            with _client(uri) as client:
                reader = client.do_get(fl.Ticket(b"with-metadata"))
                return [c.app_metadata and c.app_metadata.to_pybytes() for c in reader]

        assert await in_thread(fetch) == [b"first", b"second"]


@pytest.mark.asyncio
async def test_do_put_roundtrip_with_put_results() -> None:
    table = _many_types_table()
    handler = ToyHandler({})
    descriptor = fl.FlightDescriptor.for_path("ns", "upload")
    async with running(handler) as (_, uri):

        def upload() -> list[bytes]:
            acks = []
            with _client(uri) as client:
                writer, reader = client.do_put(descriptor, table.schema)
                for i, batch in enumerate(table.to_batches()):
                    writer.write_with_metadata(batch, b"client-%d" % i)
                    acks.append(reader.read().to_pybytes())
                writer.done_writing()
                writer.close()
            return acks

        acks = await in_thread(upload)
    assert acks == [b"ack:1", b"ack:2", b"ack:3", b"ack:4"]
    ((desc, schema, batches, app_metadata),) = handler.puts
    assert desc is not None
    assert list(desc.path) == ["ns", "upload"]
    assert schema == table.schema
    assert pa.Table.from_batches(batches, schema).equals(table)
    for got, want in zip(batches, table.to_batches(), strict=True):
        assert got.equals(want)
    assert app_metadata == [b"client-0", b"client-1", b"client-2", b"client-3"]


@pytest.mark.asyncio
async def test_flight_info_actions_and_list_actions() -> None:
    table = pa.table({"x": [1, 2, 3]})
    async with running(ToyHandler({"t": table})) as (_, uri):

        def calls() -> tuple[fl.FlightInfo, list[bytes], list[tuple[str, str]], pa.Table]:
            with _client(uri) as client:
                info = client.get_flight_info(fl.FlightDescriptor.for_path("t"))
                results = [r.body.to_pybytes() for r in client.do_action(fl.Action("echo", b"hi"))]
                actions = [(a.type, a.description) for a in client.list_actions()]
                data = client.do_get(info.endpoints[0].ticket).read_all()
            return info, results, actions, data

        info, results, actions, data = await in_thread(calls)
    assert info.schema == table.schema
    assert info.total_records == 3
    assert info.descriptor == fl.FlightDescriptor.for_path("t")
    assert results == [b"did:", b"echo", b"hi"]
    assert actions == [("echo", "echoes the body"), ("noop", "")]
    assert data.equals(table)


@pytest.mark.asyncio
async def test_errors_reach_client() -> None:
    async with running(ToyHandler({})) as (_, uri):

        def invalid() -> None:
            with _client(uri) as client:
                client.get_flight_info(fl.FlightDescriptor.for_path("missing"))

        # pyarrow maps INVALID_ARGUMENT to ArrowInvalid (a ValueError), not FlightError.
        with pytest.raises(pa.ArrowInvalid, match="unknown table 'missing'"):
            await in_thread(invalid)

        def unimplemented() -> None:
            with _client(uri) as client:
                list(client.list_flights())

        with pytest.raises(pa.ArrowNotImplementedError, match="ListFlights is not implemented"):
            await in_thread(unimplemented)


@pytest.mark.asyncio
async def test_unexpected_error_is_internal_and_not_leaked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running(ToyHandler({})) as (_, uri):

        def boom() -> None:
            with _client(uri) as client:
                client.do_get(fl.Ticket(b"boom")).read_all()

        with (
            caplog.at_level(logging.ERROR, logger="lake_core.flight.server"),
            pytest.raises(fl.FlightInternalError) as excinfo,
        ):
            await in_thread(boom)
    assert isinstance(excinfo.value, fl.FlightError)
    assert "secret" not in str(excinfo.value)
    assert "internal server error" in str(excinfo.value)
    assert any("secret internal detail" in (r.exc_text or "") for r in caplog.records)


@pytest.mark.asyncio
async def test_a_panic_is_answered_as_internal() -> None:
    """A foreign BaseException (a Rust panic inside a handler) answers the call:
    an ``except Exception`` let it through and the client waited forever."""
    async with running(ToyHandler({})) as (_, uri):

        def panic() -> None:
            with _client(uri) as client:
                options = fl.FlightCallOptions(timeout=20)
                client.do_get(fl.Ticket(b"panic"), options).read_all()

        with pytest.raises(fl.FlightInternalError) as excinfo:
            await in_thread(panic)
    assert "internal server error" in str(excinfo.value)
    assert "secret" not in str(excinfo.value)


@pytest.mark.asyncio
async def test_health_serving_on_same_port() -> None:
    # Health is authenticated like every other service.
    def bearer(metadata: dict[str, str | bytes], peer: str, method: str) -> object:
        if metadata.get("authorization") != "Bearer good":
            raise Unauthenticated("no")
        return "prober"

    good = (("authorization", "Bearer good"),)
    async with (
        running(ToyHandler({}), authenticate=bearer) as (server, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await stub.Check(health_pb2.HealthCheckRequest(service=""))
        assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for service in ("", FLIGHT_SERVICE):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), metadata=good)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        # Authenticated health calls are not counted as in-flight work.
        assert server.guard.in_flight == 0
        await server.set_serving(False)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), metadata=good)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.asyncio
async def test_auth_interceptor_rejects_and_sets_principal() -> None:
    seen: list[tuple[str, str]] = []

    def authenticate(metadata: dict[str, str | bytes], peer: str, method: str) -> object:
        seen.append((peer, method))
        if metadata.get("authorization") != "Bearer good":
            raise Unauthenticated("bad token")
        return {"principal_id": "alice"}

    table = pa.table({"x": [1]})
    handler = ToyHandler({"t": table})
    async with running(handler, authenticate=authenticate) as (server, uri):

        def call(token: bytes | None) -> pa.Table:
            headers = [(b"authorization", token)] if token else []
            with _client(uri) as client:
                options = fl.FlightCallOptions(headers=headers)
                return client.do_get(fl.Ticket(b"t"), options).read_all()

        with pytest.raises(fl.FlightUnauthenticatedError, match="bad token"):
            await in_thread(lambda: call(b"Bearer bad"))
        with pytest.raises(fl.FlightUnauthenticatedError):
            await in_thread(lambda: call(None))
        assert handler.principals == []  # rejected before the handler ran
        assert (await in_thread(lambda: call(b"Bearer good"))).equals(table)
        assert server.guard.in_flight == 0
    assert handler.principals == [{"principal_id": "alice"}]
    assert seen[-1][0].startswith("ipv4:127.0.0.1:")
    assert seen[-1][1] == f"/{FLIGHT_SERVICE}/DoGet"
    assert current_principal() is None  # nothing leaked into the test's context


@pytest.mark.asyncio
async def test_principal_is_per_call_under_concurrency() -> None:
    async def authenticate(metadata: dict[str, str | bytes], peer: str, method: str) -> object:
        await asyncio.sleep(0)
        return str(metadata["x-user"])

    async with running(ToyHandler({}), authenticate=authenticate) as (server, uri):

        def whoami(user: str) -> str:
            options = fl.FlightCallOptions(headers=[(b"x-user", user.encode())])
            with _client(uri) as client:
                table = client.do_get(fl.Ticket(b"whoami"), options).read_all()
            return str(table.column("who")[0])

        users = [f"user-{i}" for i in range(8)]
        assert await asyncio.gather(*(in_thread(lambda u=u: whoami(u)) for u in users)) == users
        assert server.guard.in_flight == 0


@pytest.mark.asyncio
async def test_async_authenticator_returning_none_is_rejected() -> None:
    async def authenticate(metadata: dict[str, str | bytes], peer: str, method: str) -> object:
        return None

    handler = ToyHandler({"t": pa.table({"x": [1]})})
    async with running(handler, authenticate=authenticate) as (_, uri):

        def call() -> None:
            with _client(uri) as client:
                client.do_get(fl.Ticket(b"t")).read_all()

        with pytest.raises(fl.FlightUnauthenticatedError, match="authentication required"):
            await in_thread(call)


def test_shutdown_grace_ms_parsing() -> None:
    assert shutdown_grace_ms({}) == 30_000
    assert shutdown_grace_ms({"LAKE_SHUTDOWN_GRACE_MS": "1500"}) == 1500
    for bad in ("0", "-5", "abc", "", "1.5", "+5", "1_000", "٣"):
        with pytest.raises(ConfigError, match="LAKE_SHUTDOWN_GRACE_MS"):
            shutdown_grace_ms({"LAKE_SHUTDOWN_GRACE_MS": bad})


@pytest.mark.asyncio
async def test_serve_stops_cleanly_on_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("loop signal handlers need the main thread")
    started: list[int | None] = []

    def on_started(server: FlightServer) -> None:
        started.append(server.port)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    await asyncio.wait_for(
        serve(ToyHandler({}), "127.0.0.1:0", grace_ms=500, on_started=on_started), 10
    )
    assert len(started) == 1
    assert started[0]
    assert signal.getsignal(signal.SIGTERM) == previous


@pytest.mark.asyncio
async def test_serve_reports_rpcs_cut_off_by_grace() -> None:
    handler = ToyHandler({})
    stop = asyncio.Event()
    ports: list[int] = []
    started = asyncio.Event()

    def on_started(server: FlightServer) -> None:
        assert server.port is not None
        ports.append(server.port)
        started.set()

    task = asyncio.create_task(
        serve(handler, "127.0.0.1:0", grace_ms=300, on_started=on_started, stop=stop)
    )
    await asyncio.wait_for(started.wait(), 10)

    def hang() -> None:
        with _client(f"grpc://127.0.0.1:{ports[0]}") as client:
            client.do_get(fl.Ticket(b"hang")).read_all()

    client_call = asyncio.create_task(in_thread(hang))
    await asyncio.wait_for(handler.hanging.wait(), 10)
    stop.set()
    with pytest.raises(UncleanShutdown) as excinfo:
        await asyncio.wait_for(task, 10)
    assert excinfo.value.in_flight == 1
    with pytest.raises(fl.FlightError):
        await asyncio.wait_for(client_call, 10)
