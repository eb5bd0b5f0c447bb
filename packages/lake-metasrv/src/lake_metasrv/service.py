"""Metasrv's Flight surface: Lake actions by DoAction, appends by DoPut.

An append whose messages are small also comes as one unary request
(:mod:`lake_core.flight.unary_put`): the same messages, the same checks.

Every call is authorized against :func:`current_principal` before the
registry or storage is touched. A table in a namespace the caller may not see
gets the same PermissionDenied whether or not it exists, so existence never
leaks.

Roles (``docs/security.md``): creating and dropping tables, and maintenance
(``optimize_table``, ``create_index``), need ``admin``;
appends need a data-plane principal (``user`` or ``admin``), which is what a
Query replica's delegated calls act as (``lake_core.auth``); any
authenticated role may describe tables and take catalog snapshots within its
namespaces.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pyarrow as pa

from lake_core import integrity, protocol, status
from lake_core.errors import (
    FailedPrecondition,
    InvalidAppend,
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
    Unimplemented,
)
from lake_core.flight import unary_put
from lake_core.flight.encoding import FlightDataDecoder
from lake_core.flight.handler import bytes_service
from lake_core.flight.server import FlightHandler, current_principal
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.schemas import schema_from_base64
from lake_metasrv.appends import observed_append
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.digests.verify import verify_table
from lake_metasrv.ingest import Ingests, ingest_command, is_ingest
from lake_metasrv.maintenance import Maintenance

__all__ = ["ACTIONS", "MetaHandler"]

Context = Any  # grpc.aio.ServicerContext; grpc ships no type information

ACTIONS: dict[str, str] = {
    protocol.CREATE_TABLE: "Create a table: {table, schema_ipc} -> DescribeTableResult",
    protocol.DROP_TABLE: "Drop a table: {table} -> DropTableResult",
    protocol.DESCRIBE_TABLE: "Describe a table: {table} -> DescribeTableResult",
    protocol.CATALOG_SNAPSHOT: (
        "Every visible table, or not_modified: {generation} -> CatalogSnapshotResult"
    ),
    protocol.TABLE_VERSION: (
        "Where a time-travel walk may start: {table, incarnation, newest, version | after_ms} "
        "-> TableVersionResult"
    ),
    protocol.OPTIMIZE_TABLE: (
        "Compact small fragments, refresh indexes (same rows and version): "
        "{table} -> MaintenanceResult"
    ),
    protocol.CREATE_INDEX: (
        "Build a scalar index: {table, column, kind=BTREE|BITMAP} -> MaintenanceResult"
    ),
    integrity.VERIFY_TABLE: (
        "Recheck size and SHA-256 of every data file: {table, all_versions} -> VerifyTableResult"
    ),
    integrity.DATA_FILE_DIGESTS: (
        "Recorded data-file digests of the current incarnation: {table, paths?} "
        "-> DataFileDigestsResult"
    ),
    status.STATUS: "Admin: this node's role, lease epoch and expiry, URLs, version -> MetasrvStatus",
}


def _caller() -> Principal:
    principal = current_principal()
    if not isinstance(principal, Principal):
        # Fail closed: a server wired without an authenticator serves nobody.
        raise Unauthenticated("authentication required")
    return principal


def _authorize(principal: Principal, table: TableRef) -> None:
    if not principal.may_see(table.namespace):
        raise PermissionDenied(f"permission denied for table {table}")


def _require_role(principal: Principal, table: TableRef, *roles: str) -> None:
    # Same message as a hidden table, after the namespace check: the role
    # check must not reveal anything the namespace check would hide.
    _authorize(principal, table)
    if principal.role not in roles:
        raise PermissionDenied(f"permission denied for table {table}")


class MetaHandler(FlightHandler):
    """The Flight handler of one Metasrv, over its commit coordinator."""

    def __init__(self, coordinator: CommitCoordinator, ingests: Ingests | None = None) -> None:
        self.coordinator = coordinator
        self.maintenance = Maintenance(coordinator)
        self.ingests = ingests or Ingests(coordinator)

    # -- DoAction ---------------------------------------------------------------

    async def list_actions(self, context: Context) -> AsyncIterator[pb.ActionType]:
        _caller()
        for name, description in ACTIONS.items():
            yield pb.ActionType(type=name, description=description)

    async def do_action(self, action: pb.Action, context: Context) -> AsyncIterator[pb.Result]:
        principal = _caller()
        body = bytes(action.body)
        result: protocol.WireModel
        if action.type == protocol.CREATE_TABLE:
            result = await self._create_table(principal, body)
        elif action.type == protocol.DROP_TABLE:
            request = protocol.decode(protocol.TableRequest, body)
            _require_role(principal, request.table, "admin")
            result = await self.coordinator.drop_table(request.table)
        elif action.type == protocol.DESCRIBE_TABLE:
            request = protocol.decode(protocol.TableRequest, body)
            _authorize(principal, request.table)
            record = await self.coordinator.describe_table(request.table)
            result = protocol.DescribeTableResult(entry=record.catalog_entry())
        elif action.type == protocol.CATALOG_SNAPSHOT:
            result = await self._catalog_snapshot(principal, body)
        elif action.type == protocol.TABLE_VERSION:
            result = await self._table_version(principal, body)
        elif action.type == protocol.OPTIMIZE_TABLE:
            request = protocol.decode(protocol.TableRequest, body)
            _require_role(principal, request.table, "admin")
            result = await self.maintenance.compact(request.table)
        elif action.type == protocol.CREATE_INDEX:
            index = protocol.decode(protocol.CreateIndexRequest, body)
            _require_role(principal, index.table, "admin")
            result = await self.maintenance.create_index(index.table, index.column, index.kind)
        elif action.type in (integrity.VERIFY_TABLE, integrity.DATA_FILE_DIGESTS):
            result = await self._integrity(principal, action.type, body)
        elif action.type == status.STATUS:
            if principal.role != "admin":
                raise PermissionDenied("lake.status needs an admin principal")
            result = self.status()
        else:
            raise Unimplemented(f"unknown action {action.type[:100]!r}")
        yield pb.Result(body=protocol.encode(result))

    def status(self) -> status.MetasrvStatus:
        """This node's role and lease (a local Metasrv always leads its data directory)."""
        return status.MetasrvStatus(
            node="local",
            role="leader",
            mode="local",
            epoch=0,
            lease_expires_in_ms=0,
            advertised_url="",
            leader_url="",
            version=status.lake_version(),
        )

    async def _integrity(self, principal: Principal, kind: str, body: bytes) -> protocol.WireModel:
        store = self.coordinator.digests
        if store is None:
            raise FailedPrecondition(
                "this Metasrv records no data-file digests (an in-memory registry)"
            )
        if kind == integrity.VERIFY_TABLE:
            verify = protocol.decode(integrity.VerifyTableRequest, body)
            _require_role(principal, verify.table, "admin")
            return await verify_table(
                self.coordinator, store, verify.table, all_versions=verify.all_versions
            )
        request = protocol.decode(integrity.DataFileDigestsRequest, body)
        _authorize(principal, request.table)
        record = await self.coordinator.describe_table(request.table)
        if request.paths is None:
            files = await asyncio.to_thread(store.recorded, record.incarnation)
        else:  # a replica verifying a version asks only for the files it has not checked
            paths = list(dict.fromkeys(request.paths))
            files = await asyncio.to_thread(store.digests_of, record.incarnation, paths)
        return integrity.DataFileDigestsResult(
            table=request.table, incarnation=record.incarnation, files=list(files.values())
        )

    async def _table_version(
        self, principal: Principal, body: bytes
    ) -> protocol.TableVersionResult:
        request = protocol.decode(protocol.TableVersionRequest, body)
        _authorize(principal, request.table)
        record = await self.coordinator.describe_table(request.table)
        if record.incarnation != request.incarnation:
            # Another incarnation's history only by its own table's name: none here.
            return protocol.TableVersionResult()
        registry, incarnation = self.coordinator.registry, request.incarnation
        if request.version is not None:
            found = await registry.version_record(incarnation, request.version)
        else:
            assert request.after_ms is not None  # the request's validator
            found = await registry.first_version_after(
                incarnation, request.after_ms, min(request.newest, record.version)
            )
        if found is None:
            return protocol.TableVersionResult()
        return protocol.TableVersionResult(
            version=found.version, engine_version=found.engine_version
        )

    async def _create_table(
        self, principal: Principal, body: bytes
    ) -> protocol.DescribeTableResult:
        request = protocol.decode(protocol.CreateTableRequest, body)
        _require_role(principal, request.table, "admin")
        schema = schema_from_base64(request.schema_ipc)
        record = await self.coordinator.create_table(request.table, schema)
        return protocol.DescribeTableResult(entry=record.catalog_entry())

    async def _catalog_snapshot(
        self, principal: Principal, body: bytes
    ) -> protocol.CatalogSnapshotResult:
        request = protocol.decode(protocol.CatalogSnapshotRequest, body)
        # An unchanged catalog is answered from the generation alone (no directory read).
        generation, records = await self.coordinator.registry.snapshot_if_changed(
            request.generation
        )
        if records is None:
            return protocol.CatalogSnapshotResult(not_modified=True, generation=generation)
        entries = [r.catalog_entry() for r in records if principal.may_see(r.table.namespace)]
        return protocol.CatalogSnapshotResult(
            not_modified=False, generation=generation, tables=entries
        )

    # -- DoPut ------------------------------------------------------------------

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Context
    ) -> AsyncIterator[pb.PutResult]:
        principal = _caller()
        first = await anext(messages, None)
        descriptor = _descriptor(first) if first is not None else None
        if first is not None and is_ingest(descriptor):
            # A bulk ingest (lake_metasrv.ingest): streamed, committed once.
            ingest = ingest_command(descriptor)
            _require_role(principal, ingest.table, "user", "admin")
            done = await self.ingests.ingest(ingest, first, messages, principal)
            yield pb.PutResult(app_metadata=protocol.encode(done))
            return

        async def stream() -> AsyncIterator[pb.FlightData]:
            if first is not None:
                yield first
            async for message in messages:
                yield message

        result = await self._append(principal, stream())
        yield pb.PutResult(app_metadata=protocol.encode(result))

    # -- Append, in one message (lake_core.flight.unary_put) ----------------------

    def extra_services(self) -> Sequence[grpc.GenericRpcHandler]:
        return (bytes_service(unary_put.APPENDS_SERVICE, {"Append": self.append_unary}),)

    async def append_unary(self, body: bytes, context: Context) -> bytes:
        """An append's DoPut messages in one request; the reply is its ``PutResult``."""
        principal = _caller()
        result = await self._append(principal, _each(_unary_messages(body)))
        return pb.PutResult(app_metadata=protocol.encode(result)).SerializeToString()

    async def _append(
        self, principal: Principal, messages: AsyncIterator[pb.FlightData]
    ) -> protocol.AppendResult:
        decoder = FlightDataDecoder(max_bytes=protocol.MAX_APPEND_BYTES, too_large=_too_large)
        command: protocol.AppendCommand | None = None
        batches: list[pa.RecordBatch] = []
        async for message in messages:
            produced = decoder.feed(message)
            if command is None:
                # Authorize on the first message, before reading any data.
                command = _append_command(decoder.descriptor)
                _require_role(principal, command.table, "user", "admin")
            batches.extend(produced)
        if command is None or decoder.schema is None:
            raise InvalidAppend("an append stream needs a descriptor and an Arrow schema")
        # Counted by outcome here, so fenced arrivals count too (lake_metasrv_commits_total).
        return await observed_append(
            self.coordinator.append(command, decoder.schema, batches, tenant_id=principal.tenant_id)
        )


def _descriptor(message: pb.FlightData) -> pb.FlightDescriptor | None:
    return message.flight_descriptor if message.HasField("flight_descriptor") else None


def _unary_messages(body: bytes) -> list[pb.FlightData]:
    """The messages of a unary append request; a bulk ingest is refused (it streams)."""
    messages = unary_put.unpack(body)
    if is_ingest(_descriptor(messages[0])):
        raise InvalidArgument("a bulk ingest is a stream: send it by DoPut")
    return messages


async def _each(messages: list[pb.FlightData]) -> AsyncIterator[pb.FlightData]:
    for message in messages:
        yield message


def _too_large(message: str) -> InvalidAppend:
    return InvalidAppend(
        f"append payload exceeds {protocol.MAX_APPEND_BYTES} encoded bytes ({message})"
    )


def _append_command(descriptor: pb.FlightDescriptor | None) -> protocol.AppendCommand:
    if descriptor is None or descriptor.type != pb.FlightDescriptor.CMD:
        raise InvalidArgument("an append's first message needs a CMD descriptor (AppendCommand)")
    return protocol.decode(protocol.AppendCommand, bytes(descriptor.cmd))
