"""Every Lake error class survives the wire with its class and retryability.

A real gRPC server built from Lake's own scaffolding raises each class of the
error tree in its handlers; the SDK (pyarrow Flight underneath), Query's
Metasrv client and a Metasrv follower forwarding to that server as its leader
each catch exactly that class. Codeless statuses (a proxy, a foreign server)
map to base classes, and no client reads the message to decide.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.auth import Authenticator
from lake_core.errors import (
    ERROR_CODE_KEY,
    RETRYABLE_KEY,
    WANTS_CODES,
    WIRE_CLASSES,
    CommitStateUnknown,
    ConfigError,
    Internal,
    InvalidArgument,
    LakeError,
    NotFound,
    Unavailable,
    error_from_wire,
)
from lake_core.flight.encoding import encode_stream
from lake_core.flight.server import FlightHandler, FlightServer
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2
from lake_core.tls import ClientTLS
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.forwarding import ForwardingMetaHandler, PeerClients

#: Classes a server can raise (ConfigError is startup-only, never sent).
SENDABLE = sorted(name for name in WIRE_CLASSES if WIRE_CLASSES[name] is not ConfigError)
SCHEMA = pa.schema([("x", pa.int64())])


def _table_for(name: str) -> TableRef:
    return TableRef(namespace="errors", name=name.lower())


_BY_TABLE = {name.lower(): name for name in SENDABLE}


def _raise(name: str, *, flip: bool = False) -> LakeError:
    cls = WIRE_CLASSES[name]
    retryable = cls.retryable is not flip
    return cls.from_wire(f"raised {name} on purpose", retryable=retryable)


class Raiser(FlightHandler):
    """Raises the class its request names, from every kind of handler."""

    async def do_action(self, action: pb.Action, context: Any) -> AsyncIterator[pb.Result]:
        if action.type == "flip":
            raise _raise(action.body.decode(), flip=True)
        if action.type == protocol.CREATE_TABLE:
            created = protocol.decode(protocol.CreateTableRequest, action.body)
            raise _raise(_BY_TABLE[created.table.name])
        if action.type == protocol.TABLE_SCHEMA:
            request = protocol.decode(protocol.TableRequest, action.body)
            raise _raise(_BY_TABLE[request.table.name])
        raise _raise(action.type)
        yield

    async def get_flight_info(self, descriptor: pb.FlightDescriptor, context: Any) -> pb.FlightInfo:
        command = flight_sql_pb2.CommandStatementQuery()
        any_pb2.Any.FromString(descriptor.cmd).Unpack(command)
        if command.query.startswith("plan:"):
            raise _raise(command.query.removeprefix("plan:"))
        ticket = pb.Ticket(ticket=command.query.encode())
        return pb.FlightInfo(
            schema=SCHEMA.serialize().to_pybytes(),
            flight_descriptor=descriptor,
            endpoint=[pb.FlightEndpoint(ticket=ticket)],
        )

    async def do_get(self, ticket: pb.Ticket, context: Any) -> AsyncIterator[bytes]:
        batch = pa.record_batch([pa.array([1, 2, 3])], schema=SCHEMA)
        for message in encode_stream(SCHEMA, [batch]):
            yield message
        raise _raise(ticket.ticket.decode())

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Any
    ) -> AsyncIterator[pb.PutResult]:
        first = await anext(messages)
        command = protocol.decode(protocol.AppendCommand, first.flight_descriptor.cmd)
        async for _ in messages:
            pass
        raise _raise(_BY_TABLE[command.table.name])
        yield


class _Leadership:
    """A follower's view: another node leads."""

    is_leader = False

    def __init__(self, url: str) -> None:
        self.leader_url = url

    async def settled(self, timeout_s: float) -> None:
        return None


class Servers:
    """In-process servers on one background loop: the raiser, and a follower of it."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.raiser = self.run(self._start(Raiser()))
        self.peers = PeerClients(None, ClientTLS())
        # The follower's own coordinator is never reached: every write is forwarded.
        coordinator = CommitCoordinator.local(MetaConfig.load(data_dir=data_dir, env={}))
        follower = ForwardingMetaHandler(
            coordinator,
            _Leadership(f"http://127.0.0.1:{self.raiser.port}"),  # type: ignore[arg-type]
            self.peers,
        )
        self.follower = self.run(self._start(follower))

    async def _start(self, handler: FlightHandler) -> FlightServer:
        server = FlightServer(handler, authenticate=Authenticator(None, delegation=True))
        await server.start("127.0.0.1:0")
        return server

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def close(self) -> None:
        self.run(self.peers.close())
        for server in (self.follower, self.raiser):
            self.run(server.shutdown(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    running = Servers(tmp_path_factory.mktemp("follower"))
    yield running
    running.close()


def _assert_same(caught: BaseException, name: str, retryable: bool) -> None:
    assert type(caught) is WIRE_CLASSES[name], f"{name} arrived as {type(caught).__name__}"
    assert isinstance(caught, LakeError)
    assert caught.retryable is retryable
    assert f"raised {name} on purpose" in str(caught)


def test_the_tree_has_one_code_per_class() -> None:
    assert len(WIRE_CLASSES) >= 40
    for name, cls in WIRE_CLASSES.items():
        assert cls.__name__ == name
        assert cls.__module__ == "lake_core.errors"
    assert "TableNotFound" in WIRE_CLASSES
    assert "DataCorrupted" in WIRE_CLASSES


@pytest.mark.parametrize("name", SENDABLE)
def test_metaclient_rebuilds_every_class(servers: Servers, name: str) -> None:
    async def call() -> None:
        client = MetaClient(f"http://127.0.0.1:{servers.raiser.port}")
        try:
            await client.action(name, protocol.CatalogSnapshotRequest(), protocol.DropTableResult)
        finally:
            await client.close()

    with pytest.raises(LakeError) as caught:
        servers.run(call())
    _assert_same(caught.value, name, WIRE_CLASSES[name].retryable)


@pytest.mark.parametrize("name", SENDABLE)
def test_follower_forwarding_keeps_every_class(servers: Servers, name: str) -> None:
    async def create() -> None:
        client = MetaClient(f"http://127.0.0.1:{servers.follower.port}")
        try:
            await client.create_table(_table_for(name), SCHEMA)
        finally:
            await client.close()

    async def append() -> None:
        client = MetaClient(f"http://127.0.0.1:{servers.follower.port}")
        command = protocol.AppendCommand(
            table=_table_for(name), operation_id="0190a8a0-0000-7000-8000-000000000000"
        )
        batch = pa.record_batch([pa.array([1])], schema=SCHEMA)
        try:
            await client.append(command, SCHEMA, [batch])
        finally:
            await client.close()

    for call in (create, append):
        with pytest.raises(LakeError) as caught:
            servers.run(call())
        _assert_same(caught.value, name, WIRE_CLASSES[name].retryable)


@pytest.mark.parametrize("name", SENDABLE)
def test_sdk_rebuilds_every_class(servers: Servers, name: str) -> None:
    from lake_sdk import AsyncClient

    async def calls() -> list[BaseException]:
        seen: list[BaseException] = []
        async with AsyncClient(f"grpc://127.0.0.1:{servers.raiser.port}") as client:
            for attempt in (
                lambda: client.table_schema(_table_for(name)),  # DoAction
                lambda: client.query(f"plan:{name}"),  # GetFlightInfo
                lambda: client.query_table(name),  # DoGet, after a first batch
            ):
                try:
                    await attempt()
                except LakeError as exc:
                    seen.append(exc)
        return seen

    seen = asyncio.run(calls())
    assert len(seen) == 3
    for caught in seen:
        _assert_same(caught, name, WIRE_CLASSES[name].retryable)


@pytest.mark.parametrize("name", ["TableNotFound", "StaleReadVersion", "Internal"])
def test_retryability_travels_with_the_error(servers: Servers, name: str) -> None:
    """The server's own retryability arrives, not the class default."""

    async def call() -> None:
        client = MetaClient(f"http://127.0.0.1:{servers.raiser.port}")
        try:
            await client.action("flip", _Body(name), protocol.DropTableResult)
        finally:
            await client.close()

    with pytest.raises(LakeError) as caught:
        servers.run(call())
    _assert_same(caught.value, name, not WIRE_CLASSES[name].retryable)


class _Body:
    """An action body sent as raw bytes (the class name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def model_dump_json(self, **_: Any) -> str:
        return self.name


def test_codeless_statuses_map_to_base_classes() -> None:
    """A proxy or foreign server sends no code: base class, only UNAVAILABLE retryable."""
    read = error_from_wire(grpc.StatusCode.NOT_FOUND, "table not found: a.b")
    assert type(read) is NotFound
    assert not read.retryable
    aborted = error_from_wire(grpc.StatusCode.ABORTED, "x")
    assert not aborted.retryable
    unavailable = error_from_wire(grpc.StatusCode.UNAVAILABLE, "x")
    assert type(unavailable) is Unavailable
    assert unavailable.retryable
    unknown = error_from_wire(grpc.StatusCode.UNKNOWN, "x")
    assert type(unknown) is Internal
    assert not unknown.retryable
    for status in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
        outcome = error_from_wire(status, "x", commit=True)
        assert type(outcome) is CommitStateUnknown
        assert outcome.retryable
    # A code the client does not know falls back to the status, never to the text.
    foreign = error_from_wire(
        grpc.StatusCode.INVALID_ARGUMENT,
        "Lake SQL is read-only",
        ((ERROR_CODE_KEY, "NoSuchClass"), (RETRYABLE_KEY, "true")),
    )
    assert type(foreign) is InvalidArgument


def test_codes_go_to_lake_clients_only(servers: Servers) -> None:
    """ADBC and pyarrow users get the bare status (ADBC hides the code of any error
    that carries metadata); a Lake client asking for codes gets both trailers."""
    from lake_core.proto import flight_grpc

    async def trailers(metadata: tuple[tuple[str, str], ...]) -> dict[str, str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{servers.raiser.port}") as channel:
            stub = flight_grpc.FlightServiceStub(channel)
            call = stub.DoAction(pb.Action(type="TableNotFound"), metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in call:
                    pass
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            return {key: value for key, value in caught.value.trailing_metadata() or ()}

    assert ERROR_CODE_KEY not in servers.run(trailers(()))
    asked = servers.run(trailers((WANTS_CODES,)))
    assert asked[ERROR_CODE_KEY] == "TableNotFound"
    assert asked[RETRYABLE_KEY] == "false"
