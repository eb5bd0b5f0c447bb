"""Metasrv's unary append (``lake_core.flight.unary_put``) against the real MetaHandler.

MetaClient sends an append whose messages fit ``UNARY_MAX_BYTES`` as one
request; these tests prove it is the same append as the DoPut one (same
checks, same replay, same refusals, nothing written on a refusal), that
larger appends still stream, that a Metasrv without the method (an older
one) is answered by DoPut, and that damaged request bodies are refused as
the sender's mistake, never as an internal error.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.errors import (
    WANTS_CODES,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    error_from_wire,
)
from lake_core.flight import unary_put
from lake_core.flight.encoding import encode_stream
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.service import MetaHandler


class CountingHandler(MetaHandler):
    """The real handler, counting which method each append came by."""

    def __init__(self, coordinator: CommitCoordinator) -> None:
        super().__init__(coordinator)
        self.unary = 0
        self.streamed = 0

    async def append_unary(self, body: bytes, context: Any) -> bytes:
        self.unary += 1
        return await super().append_unary(body, context)

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Any
    ) -> AsyncIterator[pb.PutResult]:
        self.streamed += 1
        async for result in super().do_put(messages, context):
            yield result


class OlderHandler(CountingHandler):
    """A Metasrv from before the unary append: Flight only."""

    def extra_services(self) -> Sequence[grpc.GenericRpcHandler]:
        return ()


@asynccontextmanager
async def _serving(
    coordinator: CommitCoordinator, kit: Any, kind: type[CountingHandler]
) -> AsyncIterator[tuple[CountingHandler, Any, MetaClient]]:
    """``kind`` served over ``coordinator``: (the handler, the served server, a MetaClient)."""
    made: list[CountingHandler] = []

    def make(c: CommitCoordinator) -> CountingHandler:
        made.append(kind(c))
        return made[-1]

    async with (
        kit.serve_handler(coordinator, handler=make) as served,
        MetaClient(f"http://{served.addr}") as client,
    ):
        yield made[0], served, client


def _raws(kit: Any, batches: Sequence[pa.RecordBatch], operation_id: str) -> list[bytes]:
    command = protocol.AppendCommand(table=kit.episodes, operation_id=operation_id)
    descriptor = pb.FlightDescriptor(
        type=pb.FlightDescriptor.CMD, cmd=protocol.encode(command)
    ).SerializeToString()
    return list(encode_stream(kit.schema, batches, descriptor=descriptor))


async def _call(addr: str, body: bytes) -> protocol.AppendResult:
    """One raw unary call, as any gRPC client could make it; Lake errors rebuilt."""
    async with grpc.aio.insecure_channel(addr) as channel:
        call = channel.unary_unary(unary_put.APPEND_METHOD)
        try:
            reply = await call(body, metadata=(WANTS_CODES,), timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise error_from_wire(
                exc.code(), exc.details() or "", exc.trailing_metadata()
            ) from None
    return protocol.decode(protocol.AppendResult, pb.PutResult.FromString(reply).app_metadata)


async def _rows(coordinator: CommitCoordinator, kit: Any) -> pa.Table:
    record = await coordinator.describe_table(kit.episodes)
    return await coordinator.engine.read(record.location, record.engine_version)


@pytest.mark.asyncio
async def test_small_appends_go_as_one_request_and_replay_like_doput(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    async with _serving(coordinator, kit, CountingHandler) as (handler, served, client):
        command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
        first = await client.append(command, kit.schema, [kit.make_batch(3), kit.make_batch(2, 3)])
        again = await client.append(command, kit.schema, [kit.make_batch(7)])
        # A raw call with the same framing is the same append.
        raw = await _call(
            served.addr, unary_put.pack(_raws(kit, [kit.make_batch(4, 5)], new_operation_id()))
        )
    assert (handler.unary, handler.streamed) == (3, 0)
    assert (first.version, first.replayed) == (1, False)
    assert (again.version, again.replayed, again.descriptor) == (1, True, first.descriptor)
    assert raw.version == 2
    rows = await _rows(coordinator, kit)
    assert sorted(rows.column("episode_id").to_pylist()) == sorted([f"ep-{i}" for i in range(9)])


@pytest.mark.asyncio
async def test_a_large_append_streams(coordinator: CommitCoordinator, kit: Any) -> None:
    schema = pa.schema([("episode_id", pa.utf8()), ("blob", pa.binary())])
    await coordinator.create_table(kit.episodes, schema)
    blob = b"x" * (unary_put.UNARY_MAX_BYTES // 2)
    batches = [pa.record_batch([pa.array([f"e{i}"]), pa.array([blob])], schema) for i in range(3)]
    async with _serving(coordinator, kit, CountingHandler) as (handler, _, client):
        command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
        assert (await client.append(command, schema, batches)).version == 1

        async def forwarded() -> AsyncIterator[pb.FlightData]:
            command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
            descriptor = pb.FlightDescriptor(
                type=pb.FlightDescriptor.CMD, cmd=protocol.encode(command)
            ).SerializeToString()
            for raw in encode_stream(schema, batches, descriptor=descriptor):
                yield pb.FlightData.FromString(raw)

        # What Query forwards: held until past the bound, then streamed on.
        assert (await client.append_messages(forwarded())).version == 2
    assert (handler.unary, handler.streamed) == (0, 2)
    assert (await _rows(coordinator, kit)).num_rows == 6


@pytest.mark.asyncio
async def test_an_older_metasrv_is_answered_by_doput(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    async with _serving(coordinator, kit, OlderHandler) as (handler, _, client):
        for n in range(3):
            command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
            assert (await client.append(command, kit.schema, [kit.make_batch(1, n)])).version == (
                n + 1
            )
    # The first append tried the unary method once, found none, and went by DoPut; so did
    # the rest, without trying again. Nothing was appended twice.
    assert (handler.unary, handler.streamed) == (0, 3)
    assert (await _rows(coordinator, kit)).num_rows == 3


@pytest.mark.asyncio
async def test_refusals_are_the_doput_ones_and_write_nothing(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    wrong = pa.schema([("episode_id", pa.utf8()), ("reward", pa.int64())])
    bad_rows = pa.record_batch([pa.array(["a"]), pa.array([1])], wrong)
    command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
    descriptor = pb.FlightDescriptor(
        type=pb.FlightDescriptor.CMD, cmd=protocol.encode(command)
    ).SerializeToString()
    ingest = protocol.IngestCommand(table=kit.episodes, operation_id=new_operation_id())
    ingest_descriptor = pb.FlightDescriptor(
        type=pb.FlightDescriptor.CMD, cmd=protocol.encode(ingest)
    ).SerializeToString()
    user = Principal(principal_id="u", tenant_id="t", role="user", namespaces=frozenset({"x"}))
    async with kit.serve_handler(coordinator) as served:
        with pytest.raises(InvalidArgument, match="does not match the table"):
            await _call(
                served.addr, unary_put.pack(encode_stream(wrong, [bad_rows], descriptor=descriptor))
            )
        body = encode_stream(kit.schema, [kit.make_batch(1)], descriptor=ingest_descriptor)
        with pytest.raises(InvalidArgument, match="stream: send it by DoPut"):
            await _call(served.addr, unary_put.pack(body))
    async with (
        kit.serve_handler(coordinator, authenticate=lambda *_: user) as hidden,
        MetaClient(f"http://{hidden.addr}") as client,
    ):
        with pytest.raises(PermissionDenied):
            await client.append(command, kit.schema, [kit.make_batch(1)])
    async with kit.serve_handler(coordinator, authenticate=None) as nobody:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async with grpc.aio.insecure_channel(nobody.addr) as channel:
                await channel.unary_unary(unary_put.APPEND_METHOD)(
                    unary_put.pack(_raws(kit, [kit.make_batch(1)], new_operation_id())),
                    timeout=30,
                )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (await coordinator.describe_table(kit.episodes)).version == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x05\x00", id="cut-inside-a-length"),
        pytest.param(b"\x10\x00\x00\x00abc", id="shorter-than-its-length"),
        pytest.param(b"\x03\x00\x00\x00\xff\xff\xff", id="not-flightdata"),
        pytest.param(b"\x00\x00\x00\x00", id="one-empty-message"),
    ],
)
async def test_malformed_bodies_are_invalid_argument(
    served: Any, kit: Any, coordinator: CommitCoordinator, body: bytes
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    with pytest.raises(InvalidArgument):
        await _call(served.addr, body)
    assert (await coordinator.describe_table(kit.episodes)).version == 0


@pytest.mark.asyncio
async def test_flipped_bytes_append_or_are_refused_never_internal(
    served: Any, kit: Any, coordinator: CommitCoordinator
) -> None:
    """Single-bit flips of a valid body: appended as sent, or refused as the sender's mistake.

    A flip may land in the command (another table: not found; an operation id
    that is no longer a UUIDv7, or stamped too far back or ahead), in the
    framing or Arrow metadata (invalid argument), or in the values (appended).
    """
    await coordinator.create_table(kit.episodes, kit.schema)
    rng = random.Random(31)
    appended = 0
    for _ in range(120):
        body = bytearray(unary_put.pack(_raws(kit, [kit.make_batch(3)], new_operation_id())))
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        try:
            result = await _call(served.addr, bytes(body))
        except (InvalidArgument, NotFound, FailedPrecondition):
            continue  # the sender's mistake (Internal is none of these)
        appended += 1
        assert result.version == appended
    assert (await coordinator.describe_table(kit.episodes)).version == appended
    assert (await _rows(coordinator, kit)).num_rows == 3 * appended
