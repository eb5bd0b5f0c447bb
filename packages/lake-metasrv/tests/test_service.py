"""The real MetaHandler, served by the shared grpc.aio ``serve()`` on loopback.

Driven by independent clients: pyarrow's Flight client (C++), and Lake's own
MetaClient, which is exactly what Query sends.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from lake_core import integrity, protocol, status
from lake_core.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from lake_core.flight.encoding import encode_stream
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.schemas import schema_from_base64, schema_to_base64
from lake_metasrv.commits import CommitCoordinator

T = TypeVar("T")
TABLE = {"namespace": "robots", "name": "episodes"}


async def blocking(fn: Callable[[], T]) -> T:
    """Run a blocking pyarrow client call without stalling the server's loop."""
    return await asyncio.to_thread(fn)


def action(url: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    with fl.FlightClient(url) as client:
        results = list(client.do_action(fl.Action(name, json.dumps(body).encode())))
    assert len(results) == 1
    decoded: dict[str, Any] = json.loads(results[0].body.to_pybytes())
    return decoded


def put(
    url: str,
    schema: pa.Schema,
    batches: Sequence[pa.RecordBatch],
    operation_id: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    cmd = {"table": TABLE, "operation_id": operation_id or new_operation_id(), **fields}
    with fl.FlightClient(url) as client:
        writer, reader = client.do_put(
            fl.FlightDescriptor.for_command(json.dumps(cmd).encode()), schema
        )
        for batch in batches:
            writer.write_batch(batch)
        writer.done_writing()
        buf = reader.read()
        writer.close()
    assert buf is not None
    result: dict[str, Any] = json.loads(buf.to_pybytes())
    return result


async def create(served: Any, kit: Any, schema: pa.Schema | None = None) -> dict[str, Any]:
    body = {"table": TABLE, "schema_ipc": schema_to_base64(schema or kit.schema)}
    return await blocking(lambda: action(served.url, protocol.CREATE_TABLE, body))


async def version(coordinator: CommitCoordinator, kit: Any) -> int:
    return (await coordinator.describe_table(kit.episodes)).version


@pytest.mark.asyncio
async def test_create_describe_append_replay(served: Any, kit: Any) -> None:
    created = await create(served, kit)
    entry = created["entry"]
    assert entry["descriptor"]["version"] == 0
    assert entry["descriptor"]["location"].endswith("/tables/robots/episodes.lance")
    assert schema_from_base64(entry["schema_ipc"]).equals(kit.schema)

    op = new_operation_id()
    first = await blocking(
        lambda: put(served.url, kit.schema, [kit.make_batch(2), kit.make_batch(3, 2)], op)
    )
    assert first["version"] == 1
    assert first["replayed"] is False
    assert first["operation_id"] == op

    again = await blocking(lambda: put(served.url, kit.schema, [kit.make_batch(5)], op))
    assert again["version"] == 1
    assert again["replayed"] is True
    assert again["descriptor"] == first["descriptor"]
    assert await version(served.coordinator, kit) == 1

    described = await blocking(
        lambda: action(served.url, protocol.DESCRIBE_TABLE, {"table": TABLE})
    )
    assert described["entry"]["descriptor"] == first["descriptor"]
    record = await served.coordinator.describe_table(kit.episodes)
    rows = await served.coordinator.engine.read(record.location, record.engine_version)
    assert rows.num_rows == 5


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "case",
    ["wrong_schema", "zero_rows", "empty_batch", "too_many_rows", "bad_operation_id"],
)
async def test_bad_appends_are_invalid_argument_and_write_nothing(
    served: Any, kit: Any, case: str
) -> None:
    await create(served, kit)
    schema, batches, op = kit.schema, [kit.make_batch(1)], None
    if case == "wrong_schema":
        schema = pa.schema([("episode_id", pa.utf8()), ("reward", pa.int64())])
        batches = [pa.record_batch([pa.array(["a"]), pa.array([1])], schema=schema)]
    elif case == "zero_rows":
        batches = []
    elif case == "empty_batch":
        batches = [kit.make_batch(1), kit.make_batch(0)]
    elif case == "too_many_rows":
        batches = [kit.make_batch(5_000), kit.make_batch(5_001, 5_000)]
    else:
        op = "2b7c5a6e-6b1d-4c1e-9f55-0d7f3f1c0a11"  # a UUIDv4
    with pytest.raises(pa.ArrowInvalid, match="invalid argument"):
        await blocking(lambda: put(served.url, schema, batches, op))
    assert await version(served.coordinator, kit) == 0
    history = await served.coordinator.registry.versions(
        (await served.coordinator.describe_table(kit.episodes)).incarnation
    )
    assert [v.version for v in history] == [0]


def _damaged_batch_header(kit: Any, damage: str) -> tuple[pb.FlightData, pb.FlightData]:
    """A schema message, and a batch message whose header was damaged (``damage``).

    ``lengths``: the first bit flip that pyarrow itself reads as a batch whose
    buffers disagree with its header (it reads, but does not validate);
    ``flatbuffer``: a header pyarrow cannot parse at all.
    """
    schema_message, batch_message = (
        pb.FlightData.FromString(raw) for raw in encode_stream(kit.schema, [kit.make_batch(100)])
    )
    header = batch_message.data_header
    if damage == "flatbuffer":
        return schema_message, pb.FlightData(
            data_header=header[: len(header) // 2]
            + bytes([header[len(header) // 2] ^ 0xFF])
            + header[len(header) // 2 + 1 :],
            data_body=batch_message.data_body,
        )
    for at in range(len(header)):
        for bit in range(8):
            flipped = bytearray(header)
            flipped[at] ^= 1 << bit
            pad = -len(flipped) % 8
            framed = b"".join(
                [
                    b"\xff\xff\xff\xff",
                    struct.pack("<i", len(flipped) + pad),
                    flipped,
                    bytes(pad),
                    batch_message.data_body,
                ]
            )
            try:
                read = pa.ipc.read_record_batch(
                    pa.ipc.read_message(pa.py_buffer(framed)), kit.schema
                )
            except (pa.ArrowException, OSError):
                continue
            try:
                read.validate(full=True)
            except pa.ArrowInvalid:
                return schema_message, pb.FlightData(
                    data_header=bytes(flipped), data_body=batch_message.data_body
                )
    raise AssertionError("no bit flip gave a batch that reads but does not validate")


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["lengths", "flatbuffer"])
async def test_a_damaged_batch_is_invalid_argument_and_writes_nothing(
    served: Any, kit: Any, damage: str
) -> None:
    """Arrow data that does not hold together is the sender's mistake, refused before any check.

    Before, the first case went unchecked to the row checks and Lance's
    writer, and the second raised an untyped OSError: both were answered as an
    internal server error.
    """
    await create(served, kit)
    schema_message, batch_message = _damaged_batch_header(kit, damage)
    command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
    schema_message.flight_descriptor.CopyFrom(
        pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=protocol.encode(command))
    )

    async def messages() -> AsyncIterator[pb.FlightData]:
        yield schema_message
        yield batch_message

    async with MetaClient(served.url) as client:
        with pytest.raises(InvalidArgument, match="invalid Arrow IPC data"):
            await client.append_messages(messages())
    assert await version(served.coordinator, kit) == 0


@pytest.mark.asyncio
async def test_exactly_max_rows_is_accepted(served: Any, kit: Any) -> None:
    await create(served, kit)
    batches = [kit.make_batch(4_000), kit.make_batch(6_000, 4_000)]
    assert (await blocking(lambda: put(served.url, kit.schema, batches)))["version"] == 1


@pytest.mark.asyncio
async def test_payload_over_64_mib_is_invalid_argument(served: Any, kit: Any) -> None:
    schema = pa.schema([("episode_id", pa.utf8()), ("blob", pa.binary())])
    await create(served, kit, schema)
    chunk = b"x" * (9 * 1024 * 1024)
    batches = [
        pa.record_batch([pa.array([f"e{i}"]), pa.array([chunk])], schema=schema) for i in range(8)
    ]
    with pytest.raises(pa.ArrowInvalid, match="invalid argument"):
        await blocking(lambda: put(served.url, schema, batches))
    assert await version(served.coordinator, kit) == 0


@pytest.mark.asyncio
async def test_stale_read_version_is_aborted(served: Any, kit: Any) -> None:
    await create(served, kit)
    await blocking(lambda: put(served.url, kit.schema, [kit.make_batch(1)], read_version=0))
    with pytest.raises(fl.FlightError, match=r"aborted|version"):
        await blocking(lambda: put(served.url, kit.schema, [kit.make_batch(1)], read_version=0))
    assert await version(served.coordinator, kit) == 1


@pytest.mark.asyncio
async def test_errors_carry_their_status(served: Any, kit: Any) -> None:
    with pytest.raises(pa.ArrowKeyError, match=r"table not found: robots\.episodes"):
        await blocking(lambda: action(served.url, protocol.DESCRIBE_TABLE, {"table": TABLE}))
    await create(served, kit)
    # pyarrow has no class for ALREADY_EXISTS; its message names the status.
    with pytest.raises(pa.ArrowException, match="already exists error"):
        await create(served, kit)
    with pytest.raises(NotImplementedError, match="unknown action"):
        await blocking(lambda: action(served.url, "lake.nope", {}))
    bad_name = {"table": {"namespace": "Robots", "name": "x"}}
    with pytest.raises(pa.ArrowInvalid, match="lowercase"):
        await blocking(lambda: action(served.url, protocol.DESCRIBE_TABLE, bad_name))
    with pytest.raises(pa.ArrowInvalid, match="malformed"):
        await blocking(lambda: action(served.url, protocol.DESCRIBE_TABLE, {"tabel": TABLE}))


@pytest.mark.asyncio
async def test_list_actions(served: Any) -> None:
    def names() -> list[str]:
        with fl.FlightClient(served.url) as client:
            return [a.type for a in client.list_actions()]

    assert set(await blocking(names)) == {
        protocol.CREATE_TABLE,
        protocol.DROP_TABLE,
        protocol.DESCRIBE_TABLE,
        protocol.CATALOG_SNAPSHOT,
        protocol.TABLE_VERSION,
        protocol.OPTIMIZE_TABLE,
        protocol.CREATE_INDEX,
        integrity.VERIFY_TABLE,
        integrity.DATA_FILE_DIGESTS,
        status.STATUS,
    }


@pytest.mark.asyncio
async def test_metaclient_round_trip(served: Any, kit: Any) -> None:
    """The calls Query makes, exactly as lake_core's MetaClient sends them."""
    async with MetaClient(f"http://{served.addr}") as client:
        empty = await client.catalog_snapshot(None)
        assert not empty.not_modified
        assert empty.tables == []
        same = await client.catalog_snapshot(empty.generation)
        assert same.not_modified
        assert same.tables == []

        created = await client.create_table(kit.episodes, kit.schema)
        with pytest.raises(AlreadyExists):
            await client.create_table(kit.episodes, kit.schema)
        changed = await client.catalog_snapshot(empty.generation)
        assert not changed.not_modified
        assert [e.table for e in changed.tables] == [kit.episodes]
        assert changed.tables[0] == created.entry

        command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
        result = await client.append(command, kit.schema, [kit.make_batch(3)])
        assert result.version == 1
        assert (await client.append(command, kit.schema, [kit.make_batch(3)])).replayed
        after = await client.catalog_snapshot(changed.generation)
        assert after.tables[0].descriptor == result.descriptor
        assert (await client.catalog_snapshot(after.generation)).not_modified

        described = await client.describe_table(kit.episodes)
        assert described.entry.descriptor.version == 1
        dropped = await client.drop_table(kit.episodes)
        assert dropped.dropped_version == 1
        with pytest.raises(NotFound):
            await client.describe_table(kit.episodes)
        gone = await client.catalog_snapshot(after.generation)
        assert gone.tables == []
        assert not gone.not_modified


@pytest.mark.asyncio
async def test_hidden_namespace_is_permission_denied_like_a_missing_table(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)
    await coordinator.create_table(TableRef("fleet", "robots"), kit.schema)
    user = Principal(principal_id="u", tenant_id="t", role="user", namespaces=frozenset({"fleet"}))
    async with (
        kit.serve_handler(coordinator, authenticate=lambda *_: user) as served,
        MetaClient(f"http://{served.addr}") as client,
    ):
        with pytest.raises(PermissionDenied) as existing:
            await client.describe_table(kit.episodes)
        with pytest.raises(PermissionDenied) as missing:
            await client.describe_table(TableRef("robots", "nothing"))
        assert str(existing.value).replace("episodes", "X") == str(missing.value).replace(
            "nothing", "X"
        )
        with pytest.raises(PermissionDenied):
            await client.drop_table(kit.episodes)
        with pytest.raises(PermissionDenied):
            await client.create_table(TableRef("robots", "new"), kit.schema)
        command = protocol.AppendCommand(table=kit.episodes, operation_id=new_operation_id())
        with pytest.raises(PermissionDenied):
            await client.append(command, kit.schema, [kit.make_batch(1)])
        hidden = protocol.TableVersionRequest(
            table=kit.episodes, incarnation="any", newest=0, version=0
        )
        with pytest.raises(PermissionDenied):
            await client.action(protocol.TABLE_VERSION, hidden, protocol.TableVersionResult)
        snapshot = await client.catalog_snapshot(None)
        assert [e.table for e in snapshot.tables] == [TableRef("fleet", "robots")]
        assert (await client.describe_table(TableRef("fleet", "robots"))).entry
    assert await version(coordinator, kit) == 0
    assert await coordinator.registry.get_table(TableRef("robots", "new")) is None


@pytest.mark.asyncio
async def test_unauthenticated_server_serves_nobody(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    async with kit.serve_handler(coordinator, authenticate=None) as served:
        with pytest.raises(fl.FlightUnauthenticatedError):
            await blocking(lambda: action(served.url, protocol.CATALOG_SNAPSHOT, {}))


@pytest.mark.asyncio
async def test_status_names_a_local_metasrv_the_leader_for_admins_only(
    served: Any, coordinator: CommitCoordinator, kit: Any
) -> None:
    async with MetaClient(f"http://{served.addr}") as admin:
        answer = await admin.action(status.STATUS, status.StatusRequest(), status.MetasrvStatus)
    assert answer.role == "leader"
    assert answer.mode == "local"
    assert answer.version

    user = Principal(principal_id="u", tenant_id="t", role="user")
    async with (
        kit.serve_handler(coordinator, authenticate=lambda *_: user) as as_user,
        MetaClient(f"http://{as_user.addr}") as client,
    ):
        with pytest.raises(PermissionDenied):
            await client.action(status.STATUS, status.StatusRequest(), status.MetasrvStatus)


@pytest.mark.asyncio
async def test_table_version_names_a_registered_version_of_the_named_incarnation(
    served: Any, kit: Any
) -> None:
    created = await create(served, kit)
    incarnation = created["entry"]["descriptor"]["incarnation"]
    for start in range(3):
        assert (
            await blocking(lambda s=start: put(served.url, kit.schema, [kit.make_batch(1, s)]))
        )["version"] == start + 1

    def ask(**fields: Any) -> dict[str, Any]:
        body = {"table": TABLE, "incarnation": incarnation, "newest": 3, **fields}
        return action(served.url, protocol.TABLE_VERSION, body)

    second = await blocking(lambda: ask(version=2))
    assert second["version"] == 2
    assert second["engine_version"] >= 3
    # The oldest version committed after an instant: before the table, its creation.
    assert (await blocking(lambda: ask(after_ms=0)))["version"] == 0
    assert (await blocking(lambda: ask(after_ms=2**62)))["version"] is None
    # Another incarnation's history is not found through this table's name.
    other = await blocking(lambda: ask(version=2, incarnation="0" * 36))
    assert other == {"schema_version": 1, "version": None, "engine_version": None}
    # A version beyond int64 is malformed too, not an overflow inside the registry.
    beyond = {"version": 2**63, "newest": 2**63}
    for wrong in ({"version": 1, "after_ms": 5}, {}, {"version": 4}, {"version": -1}, beyond):
        with pytest.raises(pa.ArrowInvalid, match="malformed TableVersionRequest"):
            await blocking(lambda w=wrong: ask(**w))
