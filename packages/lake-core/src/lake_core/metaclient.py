"""The Metasrv wire client: Lake actions and appends over grpc.aio.

Query replicas and the administrative CLI use it; the SDK never does (it
talks to Query only).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

import grpc
import pyarrow as pa
from pydantic import BaseModel

from lake_core import protocol
from lake_core.auth import ON_BEHALF_OF_HEADER, Secret, encode_on_behalf_of
from lake_core.endpoints import parse_endpoint
from lake_core.errors import (
    WANTS_CODES,
    InvalidArgument,
    LakeError,
    error_from_wire,
    wire_code,
)
from lake_core.flight import unary_put
from lake_core.flight.encoding import encode_stream
from lake_core.names import TableRef
from lake_core.principal import Principal
from lake_core.proto import flight_grpc, flight_pb2
from lake_core.protocol import MAX_MESSAGE_BYTES
from lake_core.schemas import schema_to_base64
from lake_core.telemetry.propagation import client_span

__all__ = ["MetaClient"]

M = TypeVar("M", bound=BaseModel)
DO_ACTION = "/arrow.flight.protocol.FlightService/DoAction"
DO_PUT = "/arrow.flight.protocol.FlightService/DoPut"


def _target(addr: str) -> tuple[str, bool]:
    endpoint = parse_endpoint(addr)
    target, tls = (addr, False) if endpoint is None else (endpoint.target, endpoint.tls)
    _check_port(addr, target)
    return target, tls


def _check_port(addr: str, target: str) -> None:
    """Refuse a numeric port outside 1..65535.

    gRPC takes it modulo 65536 (127.0.0.1:99999 dials port 34463): the
    client would wait for, or talk to, a server nobody named.
    """
    port = target.rpartition(":")[2]
    if port.isdigit() and not 0 < int(port) <= 65535:
        raise InvalidArgument(f"Metasrv address {addr!r}: port {port} is not in 1..65535")


class MetaClient:
    """An async client of one Metasrv endpoint."""

    def __init__(
        self,
        addr: str,
        *,
        token: str | Secret | None = None,
        ca_pem: bytes | None = None,
        server_name: str | None = None,
        timeout_s: float = 30.0,
        max_reconnect_backoff_ms: int = 1000,
    ) -> None:
        target, tls = _target(addr)
        options: list[tuple[str, object]] = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # Metasrv restarts and fails over: reconnect within seconds, not gRPC's 2 minutes.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms),
            # Its own connections: gRPC otherwise shares one per target and options
            # process-wide, so a new client made after Metasrv came back inherited an
            # older client's failed connection and failed fast until its backoff ended.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if tls:
            creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = flight_grpc.FlightServiceStub(self._channel)  # type: ignore[no-untyped-call]
        # Raw bytes both ways (lake_core.flight.unary_put frames the request).
        self._append_call = self._channel.unary_unary(unary_put.APPEND_METHOD)
        #: Whether the server has the unary append (a Metasrv older than it has not).
        self._unary = True
        secret = token if isinstance(token, Secret) or token is None else Secret(token)
        credentials = (("authorization", f"Bearer {secret.reveal()}"),) if secret else ()
        self._metadata: tuple[tuple[str, str], ...] = (*credentials, WANTS_CODES)
        self._timeout = timeout_s
        self.addr = addr

    def __repr__(self) -> str:
        return f"MetaClient({self.addr!r})"

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> MetaClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _call_metadata(self, on_behalf_of: Principal | None) -> tuple[tuple[str, str], ...]:
        """Credentials, plus the end user this call is made for (Metasrv authorizes them)."""
        if on_behalf_of is None:
            return self._metadata
        return (*self._metadata, (ON_BEHALF_OF_HEADER, encode_on_behalf_of(on_behalf_of)))

    async def action(
        self,
        action_type: str,
        body: BaseModel,
        result: type[M],
        *,
        on_behalf_of: Principal | None = None,
        credentials: tuple[tuple[str, str], ...] | None = None,
    ) -> M:
        """One action; ``credentials`` (a caller's own, relayed) replace this client's."""
        request = flight_pb2.Action(type=action_type, body=protocol.encode(body))
        if credentials is None:
            metadata = self._call_metadata(on_behalf_of)
        else:
            metadata = (*credentials, WANTS_CODES)
        # The caller's trace continues on Metasrv (W3C traceparent in the metadata).
        with client_span(DO_ACTION) as trace:
            try:
                call = self._stub.DoAction(
                    request, metadata=(*metadata, *trace), timeout=self._timeout
                )
                payload = b""
                async for item in call:
                    payload = item.body
                    break
            except grpc.aio.AioRpcError as exc:
                raise lake_error(exc) from None
        return protocol.decode(result, payload)

    async def create_table(
        self, table: TableRef, schema: pa.Schema
    ) -> protocol.DescribeTableResult:
        request = protocol.CreateTableRequest(table=table, schema_ipc=schema_to_base64(schema))
        return await self.action(protocol.CREATE_TABLE, request, protocol.DescribeTableResult)

    async def create_table_as_caller(
        self, table: TableRef, schema: pa.Schema, authorization: str | None
    ) -> protocol.DescribeTableResult:
        """:meth:`create_table` with the caller's own ``authorization`` header, relayed unchanged.

        Creating a table is administrative: Metasrv must see the administrator
        itself, never a delegated (data-plane) call (a bulk ingest's ``create`` mode).
        """
        request = protocol.CreateTableRequest(table=table, schema_ipc=schema_to_base64(schema))
        credentials = () if authorization is None else (("authorization", authorization),)
        return await self.action(
            protocol.CREATE_TABLE, request, protocol.DescribeTableResult, credentials=credentials
        )

    async def drop_table(self, table: TableRef) -> protocol.DropTableResult:
        request = protocol.TableRequest(table=table)
        return await self.action(protocol.DROP_TABLE, request, protocol.DropTableResult)

    async def drop_table_as_caller(
        self, table: TableRef, authorization: str | None
    ) -> protocol.DropTableResult:
        """:meth:`drop_table` with the caller's own ``authorization`` header, relayed unchanged."""
        request = protocol.TableRequest(table=table)
        credentials = () if authorization is None else (("authorization", authorization),)
        return await self.action(
            protocol.DROP_TABLE, request, protocol.DropTableResult, credentials=credentials
        )

    async def describe_table(
        self, table: TableRef, *, on_behalf_of: Principal | None = None
    ) -> protocol.DescribeTableResult:
        request = protocol.TableRequest(table=table)
        return await self.action(
            protocol.DESCRIBE_TABLE,
            request,
            protocol.DescribeTableResult,
            on_behalf_of=on_behalf_of,
        )

    async def catalog_snapshot(self, generation: str | None) -> protocol.CatalogSnapshotResult:
        request = protocol.CatalogSnapshotRequest(generation=generation)
        return await self.action(protocol.CATALOG_SNAPSHOT, request, protocol.CatalogSnapshotResult)

    async def optimize_table(self, table: TableRef) -> protocol.MaintenanceResult:
        """Compact small fragments (and refresh indexes); same rows, same Lake version."""
        request = protocol.TableRequest(table=table)
        return await self.action(protocol.OPTIMIZE_TABLE, request, protocol.MaintenanceResult)

    async def create_index(
        self, table: TableRef, column: str, kind: protocol.IndexKind = "BTREE"
    ) -> protocol.MaintenanceResult:
        """Build a scalar index on ``column`` (Query's filters on it then use it)."""
        request = protocol.CreateIndexRequest(table=table, column=column, kind=kind)
        return await self.action(protocol.CREATE_INDEX, request, protocol.MaintenanceResult)

    async def append_messages(
        self,
        messages: AsyncIterator[flight_pb2.FlightData],
        *,
        on_behalf_of: Principal | None = None,
    ) -> protocol.AppendResult:
        """Forward an already-encoded DoPut stream (its first message carries the command).

        An append whose messages fit :data:`~lake_core.flight.unary_put.UNARY_MAX_BYTES`
        goes as one request (:meth:`append_raw`); a larger one streams on.
        """
        held: list[flight_pb2.FlightData] = []
        if self._unary:
            raws: list[bytes] = []
            size = 0
            async for message in messages:
                held.append(message)
                raws.append(message.SerializeToString())
                size += unary_put.framed_size(raws[-1:])
                if size > unary_put.UNARY_MAX_BYTES:
                    break
            else:
                return await self.append_raw(raws, on_behalf_of=on_behalf_of)

        async def stream() -> AsyncIterator[flight_pb2.FlightData]:
            for message in held:
                yield message
            async for message in messages:
                yield message

        payload = await self._put(stream(), on_behalf_of, self._timeout)
        return protocol.decode(protocol.AppendResult, payload)

    async def append_raw(
        self, raws: Sequence[bytes], *, on_behalf_of: Principal | None = None
    ) -> protocol.AppendResult:
        """One append whose serialized DoPut messages are ``raws``.

        One unary request when they fit
        :data:`~lake_core.flight.unary_put.UNARY_MAX_BYTES`, else a DoPut
        stream. Against a Metasrv without the unary method (an older one,
        during a rolling upgrade) the append goes as a stream, and so do this
        client's later appends.
        """
        if self._unary and unary_put.framed_size(raws) <= unary_put.UNARY_MAX_BYTES:
            metadata = self._call_metadata(on_behalf_of)
            body = unary_put.pack(raws)
            with client_span(unary_put.APPEND_METHOD) as trace:
                try:
                    reply = await self._append_call(
                        body, metadata=(*metadata, *trace), timeout=self._timeout
                    )
                except grpc.aio.AioRpcError as exc:
                    if not _missing_method(exc):
                        raise lake_error(exc, commit=True) from None
                    self._unary = False  # nothing ran: the server has no such method
                else:
                    payload = flight_pb2.PutResult.FromString(reply).app_metadata
                    return protocol.decode(protocol.AppendResult, payload)

        async def stream() -> AsyncIterator[flight_pb2.FlightData]:
            for raw in raws:
                yield flight_pb2.FlightData.FromString(raw)

        payload = await self._put(stream(), on_behalf_of, self._timeout)
        return protocol.decode(protocol.AppendResult, payload)

    async def ingest_messages(
        self,
        messages: AsyncIterator[flight_pb2.FlightData],
        *,
        on_behalf_of: Principal | None = None,
    ) -> protocol.IngestResult:
        """Stream a bulk ingest (first message: an IngestCommand; last: INGEST_END).

        No deadline: an ingest runs as long as its stream (bounded by Metasrv's limits).
        """
        payload = await self._put(messages, on_behalf_of, None)
        return protocol.decode(protocol.IngestResult, payload)

    async def _put(
        self,
        messages: AsyncIterator[flight_pb2.FlightData],
        on_behalf_of: Principal | None,
        deadline_s: float | None,
    ) -> bytes:
        metadata = self._call_metadata(on_behalf_of)
        with client_span(DO_PUT) as trace:
            try:
                call = self._stub.DoPut(messages, metadata=(*metadata, *trace), timeout=deadline_s)
                payload = b""
                async for item in call:
                    payload = item.app_metadata
            except grpc.aio.AioRpcError as exc:
                raise lake_error(exc, commit=True) from None
        return bytes(payload)

    async def append(
        self,
        command: protocol.AppendCommand,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
        *,
        on_behalf_of: Principal | None = None,
    ) -> protocol.AppendResult:
        descriptor = flight_pb2.FlightDescriptor(
            type=flight_pb2.FlightDescriptor.CMD, cmd=protocol.encode(command)
        ).SerializeToString()
        raws = list(encode_stream(schema, batches, descriptor=descriptor))
        return await self.append_raw(raws, on_behalf_of=on_behalf_of)


def _missing_method(exc: grpc.aio.AioRpcError) -> bool:
    """UNIMPLEMENTED from gRPC itself (no such method), not from a Lake server's handler."""
    return (
        exc.code() == grpc.StatusCode.UNIMPLEMENTED and wire_code(exc.trailing_metadata()) is None
    )


def lake_error(exc: grpc.aio.AioRpcError, *, commit: bool = False) -> LakeError:
    """The Lake error for a failed call to a Lake server, rebuilt from its wire code.

    ``commit`` marks calls whose outcome may be unknown after a failure
    (appends): without a Lake code those become :class:`CommitStateUnknown`.
    """
    code = exc.code()
    details = exc.details() or code.name
    trailers = exc.trailing_metadata()
    if wire_code(trailers) is None and code in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
    ):
        details = f"metadata service unavailable: {details}"
    return error_from_wire(code, details, trailers, commit=commit)
