"""An in-memory Query for unit tests: ``AsyncClient(url, transport=MockTransport())``.

As httpx's ``MockTransport`` lets a test run an ``httpx.Client`` with no
server, this one answers a Lake client's calls from memory::

    import pyarrow as pa
    import lake_sdk

    transport = lake_sdk.MockTransport()
    transport.add_table("robots.runs", pa.table({"id": pa.array([1, 2], pa.int64())}))
    with lake_sdk.Client("mock://", transport=transport) as client:
        assert client.query_table("SELECT * FROM robots.runs").num_rows == 2
        assert client.append_batches("robots.runs", client.query("SELECT * FROM robots.runs").to_table()) == 2

What it answers: table actions (create, describe, list, drop), appends and
bulk ingests (each a new version; an operation id is committed at most
once), and SQL through ``query`` (a function from SQL text to a pyarrow
Table; by default ``SELECT * FROM ns.table`` and nothing else). Every call is
recorded in ``calls`` (``"action lake.list_tables"``, ``"flight_info"``,
``"stream"``, ``"append"``, ``"ingest"``). Not answered: durable jobs (they
poll over their own gRPC channel) and stage discovery (pass ``store=``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.errors import (
    InvalidArgument,
    SchemaMismatch,
    TableExists,
    TableNotFound,
    Unavailable,
    Unimplemented,
)
from lake_core.models import CatalogEntry, TableDescriptor
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_core.schemas import schema_from_base64, schema_to_base64
from lake_sdk._errors import Trailers
from lake_sdk._transport import CommittedVersions, ConnectOptions, Transport

__all__ = ["MockTransport"]

_SELECT_ALL = re.compile(r"\s*select\s+\*\s+from\s+(?:lake\.)?([\w.]+)\s*;?\s*", re.IGNORECASE)


@dataclass
class _Table:
    rows: pa.Table
    version: int = 0


class _Chunk:
    def __init__(self, data: pa.RecordBatch) -> None:
        self.data = data
        self.app_metadata = None


class _Stream:
    """pyarrow's FlightStreamReader, as far as a query result reads it."""

    def __init__(self, table: pa.Table) -> None:
        self._batches: Iterator[pa.RecordBatch] = iter(table.to_batches())
        self.cancelled = False

    def read_chunk(self) -> _Chunk:
        if self.cancelled:
            raise StopIteration
        return _Chunk(next(self._batches))

    def cancel(self) -> None:
        self.cancelled = True


class MockTransport(Transport):
    """An in-memory Query: tables in a dict, SQL answered by ``query``, no server, no threads."""

    def __init__(
        self,
        *,
        query: Callable[[str], pa.Table] | None = None,
        available: bool = True,
        url: str = "mock://",
    ) -> None:
        self.url = url
        self.options = ConnectOptions()
        self.committed = CommittedVersions()
        self.available = available
        self.closed = False
        #: Every call, in order, for tests to assert on.
        self.calls: list[str] = []
        self._query = query or self._select_all
        self._tables: dict[TableRef, _Table] = {}
        self._operations: dict[str, protocol.AppendResult] = {}
        self._results: dict[bytes, pa.Table] = {}
        self._tickets = itertools.count(1)

    def __repr__(self) -> str:
        return f"MockTransport({self.url!r}, {len(self._tables)} tables)"

    # -- test set-up -----------------------------------------------------------

    def add_table(self, table: TableRef | str, data: pa.Table | pa.Schema) -> None:
        """Create ``table`` (``ns.name``) holding ``data`` (version 0), or empty with a schema."""
        ref = table if isinstance(table, TableRef) else TableRef.parse(table)
        rows = data.empty_table() if isinstance(data, pa.Schema) else data
        self._tables[ref] = _Table(rows)

    def table(self, table: TableRef | str) -> pa.Table:
        """The rows ``table`` holds now."""
        return self._get(table if isinstance(table, TableRef) else TableRef.parse(table)).rows

    def _get(self, ref: TableRef) -> _Table:
        found = self._tables.get(ref)
        if found is None:
            raise TableNotFound(f"table {ref} not found")
        return found

    def _entry(self, ref: TableRef) -> CatalogEntry:
        table = self._get(ref)
        descriptor = TableDescriptor(
            location=f"memory://{ref.namespace}/{ref.name}",
            incarnation="mock",
            version=table.version,
            engine_version=table.version + 1,
        )
        return CatalogEntry(
            table=ref, descriptor=descriptor, schema_ipc=schema_to_base64(table.rows.schema)
        )

    def _select_all(self, sql: str) -> pa.Table:
        match = _SELECT_ALL.fullmatch(sql)
        if match is None:
            raise Unimplemented(f"MockTransport answers only SELECT * FROM ns.table: {sql!r}")
        return self.table(match.group(1))

    # -- Transport ---------------------------------------------------------------

    async def wait_ready(self, timeout_s: float) -> None:
        self.calls.append("wait_ready")
        if not self.available:
            raise Unavailable(f"Lake Query at {self.url} is not reachable: mock unavailable")

    async def action(self, name: str, body: bytes) -> bytes:
        self.calls.append(f"action {name}")
        if name == protocol.TABLE_SCHEMA:
            ref = protocol.decode(protocol.TableRequest, body).table
            return protocol.encode(protocol.DescribeTableResult(entry=self._entry(ref)))
        if name == protocol.LIST_TABLES:
            refs = sorted(self._tables, key=lambda r: (r.namespace, r.name))
            return protocol.encode(protocol.ListTablesResult(tables=[self._entry(r) for r in refs]))
        if name == protocol.CREATE_TABLE:
            request = protocol.decode(protocol.CreateTableRequest, body)
            if request.table in self._tables:
                raise TableExists(f"table {request.table} already exists")
            self.add_table(request.table, schema_from_base64(request.schema_ipc))
            return protocol.encode(protocol.DescribeTableResult(entry=self._entry(request.table)))
        if name == protocol.DROP_TABLE:
            ref = protocol.decode(protocol.TableRequest, body).table
            dropped = self._get(ref).version
            del self._tables[ref]
            return protocol.encode(protocol.DropTableResult(table=ref, dropped_version=dropped))
        raise Unimplemented(f"MockTransport does not answer the action {name!r}")

    async def flight_info(self, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        self.calls.append("flight_info")
        wrapper = any_pb2.Any.FromString(descriptor.command)
        command = flight_sql_pb2.CommandStatementQuery()
        if not wrapper.Unpack(command):
            raise InvalidArgument("MockTransport plans only CommandStatementQuery")
        result = self._query(command.query)
        ticket = str(next(self._tickets)).encode()
        self._results[ticket] = result
        endpoint = flight.FlightEndpoint(ticket, [])
        return flight.FlightInfo(result.schema, descriptor, [endpoint], result.num_rows, -1)

    def at(self, locations: Sequence[flight.Location]) -> Transport:
        return self

    async def stream(self, ticket: flight.Ticket) -> tuple[Any, Trailers]:
        self.calls.append("stream")
        result = self._results.pop(ticket.ticket, None)
        if result is None:
            raise InvalidArgument("MockTransport: an unknown or already redeemed ticket")
        return _Stream(result), {}

    async def append(
        self,
        descriptor: flight.FlightDescriptor,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
    ) -> protocol.AppendResult:
        self.calls.append("append")
        command = protocol.decode(protocol.AppendCommand, descriptor.command)
        version = self._commit(command.table, command.operation_id, schema, batches)
        result = protocol.AppendResult(
            table=command.table,
            operation_id=command.operation_id,
            version=version.version,
            descriptor=version.descriptor,
            replayed=version.replayed,
        )
        self.committed.record(result.table, result.version)
        return result

    async def ingest(
        self, descriptor: flight.FlightDescriptor, reader: pa.RecordBatchReader
    ) -> protocol.IngestResult:
        self.calls.append("ingest")
        wrapper = any_pb2.Any.FromString(descriptor.command)
        command = flight_sql_pb2.CommandStatementIngest()
        if not wrapper.Unpack(command):
            raise InvalidArgument("MockTransport ingests only CommandStatementIngest")
        ref = TableRef(namespace=command.schema, name=command.table)
        operation_id = command.options["lake.operation_id"]
        batches = list(reader)
        committed = self._commit(ref, operation_id, reader.schema, batches)
        return protocol.IngestResult(
            table=ref,
            operation_id=operation_id,
            version=committed.version,
            rows=sum(b.num_rows for b in batches),
            replayed=committed.replayed,
        )

    def _commit(
        self,
        ref: TableRef,
        operation_id: str,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
    ) -> _Committed:
        earlier = self._operations.get(operation_id)
        if earlier is not None:
            return _Committed(earlier.version, earlier.descriptor, replayed=True)
        table = self._get(ref)
        if not schema.equals(table.rows.schema):
            raise SchemaMismatch(f"the append's schema is not table {ref}'s")
        table.rows = pa.concat_tables([table.rows, pa.Table.from_batches(batches, schema)])
        table.version += 1
        descriptor = self._entry(ref).descriptor
        self._operations[operation_id] = protocol.AppendResult(
            table=ref, operation_id=operation_id, version=table.version, descriptor=descriptor
        )
        return _Committed(table.version, descriptor)

    async def close(self) -> None:
        self.calls.append("close")
        self.closed = True


@dataclass(frozen=True)
class _Committed:
    version: int
    descriptor: TableDescriptor
    replayed: bool = False
