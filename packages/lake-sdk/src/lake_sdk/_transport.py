"""How the SDK reaches Query: endpoint URLs, credentials, TLS and the Flight calls.

:class:`ConnectOptions` holds the validated bearer token (a
:class:`~lake_core.auth.Secret`, never shown in a ``repr``, an error or a
log line), the CA bundle and the expected server name. :class:`Connection`
is the one pyarrow ``FlightClient`` a client and its clones share; every
call it makes runs inside :func:`~lake_sdk._errors.calling` and turns a
pyarrow failure into the exact Lake error class the server sent. An
endpoint whose ``location`` names another server (Query's native data plane)
is read through a connection to it with the same token, CA bundle and
server name (:meth:`Connection.at`).

Read-your-writes: a connection remembers the highest version each append
through it committed per table (:class:`CommittedVersions`), and sends them
with its statements in the ``lake-min-versions`` header
(:mod:`lake_core.min_versions`), so a Query replica that has not seen them
yet refreshes its catalog before planning.

The seam: :class:`Transport` is what a client sends every call through;
:class:`Connection` is the Flight implementation ``AsyncClient(url)`` builds,
and ``AsyncClient(url, transport=...)`` takes another, such as the in-memory
:class:`~lake_sdk.MockTransport` unit tests use (no server).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from lake_core import protocol
from lake_core.auth import Secret
from lake_core.endpoints import SCHEMES as ENDPOINT_SCHEMES
from lake_core.endpoints import parse_endpoint
from lake_core.errors import (
    FailedPrecondition,
    InvalidArgument,
    LakeError,
    Unavailable,
    Unimplemented,
)
from lake_core.min_versions import MIN_VERSIONS_HEADER, format_min_versions
from lake_core.names import TableRef
from lake_core.telemetry.propagation import client_span, trace_headers
from lake_sdk._errors import TrailerCapture, Trailers, calling, lake_error

__all__ = [
    "SCHEMES",
    "CommittedVersions",
    "ConnectOptions",
    "Connection",
    "Transport",
    "flight_location",
]

T = TypeVar("T")
_Result = TypeVar("_Result", protocol.AppendResult, protocol.IngestResult)

#: The endpoint schemes a client accepts (``http``/``grpc`` plaintext, ``https``/``grpc+tls`` TLS).
SCHEMES = tuple(scheme.prefix for scheme in ENDPOINT_SCHEMES)
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")
_SERVER_NAME = re.compile(r"[A-Za-z0-9.-]{1,253}|[0-9A-Fa-f:.]{2,45}")


def flight_location(url: str) -> str:
    """The pyarrow Flight location for a Lake endpoint URL."""
    endpoint = parse_endpoint(url) if isinstance(url, str) else None
    if endpoint is None:
        raise InvalidArgument(f"Lake endpoint {url!r} must start with one of {', '.join(SCHEMES)}")
    return endpoint.flight_location


def check_token(token: str) -> Secret:
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        # The value is never echoed: it may be a real credential.
        raise InvalidArgument("a bearer token must be visible ASCII without spaces")
    return Secret(token)


def check_ca_pem(pem: bytes | str) -> bytes:
    data = pem.encode() if isinstance(pem, str) else bytes(pem)
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise InvalidArgument("the CA certificate must be PEM text (BEGIN CERTIFICATE)")
    return data


def check_server_name(name: str) -> str:
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise InvalidArgument(f"server name must be a DNS name or IP address, got {name!r}")
    return name


class _BearerMiddleware(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, header: str) -> None:
        self._header = header

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": self._header}

    def __repr__(self) -> str:
        return "_BearerMiddleware(***)"


class _BearerFactory(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, token: Secret) -> None:
        self._token = token

    def start_call(self, info: Any) -> _BearerMiddleware:
        return _BearerMiddleware(f"Bearer {self._token.reveal()}")

    def __repr__(self) -> str:
        return "_BearerFactory(***)"


class _TraceMiddleware(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def sending_headers(self) -> dict[str, str]:
        return self._headers


class _TraceFactory(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    """W3C ``traceparent`` of the caller's current span (the application's tracer)."""

    def start_call(self, info: Any) -> _TraceMiddleware | None:
        # Runs on the calling thread, whose context asyncio.to_thread copied.
        headers = trace_headers()
        return _TraceMiddleware(dict(headers)) if headers else None


_FLIGHT = "/arrow.flight.protocol.FlightService/"
#: Flight's location meaning "the connection the FlightInfo came from".
_REUSE = "arrow-flight-reuse-connection:"
#: OpenTelemetry database conventions: the system and a closed operation name, never SQL.
_DB = {"db.system.name": "lake"}


@dataclass(frozen=True, repr=False)
class ConnectOptions:
    """Credentials and TLS verification for one endpoint."""

    bearer_token: Secret | None = None
    ca_pem: bytes | None = None
    server_name: str | None = None

    @classmethod
    def create(
        cls,
        *,
        token: str | None = None,
        ca_pem: bytes | str | None = None,
        server_name: str | None = None,
    ) -> ConnectOptions:
        """Validated options (InvalidArgument names the bad one, never a token's value)."""
        return cls(
            None if token is None else check_token(token),
            None if ca_pem is None else check_ca_pem(ca_pem),
            None if server_name is None else check_server_name(server_name),
        )

    def __repr__(self) -> str:
        token = "***" if self.bearer_token is not None else None
        ca = "<pem>" if self.ca_pem is not None else None
        return (
            f"ConnectOptions(bearer_token={token}, ca_pem={ca}, server_name={self.server_name!r})"
        )

    def flight_client(self, url: str, location: str) -> flight.FlightClient:
        """A pyarrow FlightClient for ``location`` (``url`` as the caller wrote it)."""
        endpoint = parse_endpoint(url)
        tls = endpoint is not None and endpoint.tls
        if not tls and (self.ca_pem is not None or self.server_name is not None):
            raise InvalidArgument(
                f"a CA certificate or server name needs a TLS endpoint (https://), got {url!r}"
            )
        middleware: list[flight.ClientMiddlewareFactory] = [TrailerCapture(), _TraceFactory()]
        kwargs: dict[str, Any] = {"middleware": middleware}
        if self.ca_pem is not None:
            kwargs["tls_root_certs"] = self.ca_pem
        if self.server_name is not None:
            kwargs["override_hostname"] = self.server_name
        if self.bearer_token is not None:
            middleware.append(_BearerFactory(self.bearer_token))
        try:
            return flight.FlightClient(location, **kwargs)
        except pa.ArrowInvalid as exc:  # e.g. grpc://host:port:junk
            raise InvalidArgument(f"Lake endpoint {url!r} is not a valid address: {exc}") from None


class CommittedVersions:
    """The highest version this client committed per table, most recent commit first.

    Thread-safe; remembers at most :data:`REMEMBERED` tables (the least
    recently appended to are forgotten), and the header carries the most
    recent that fit its bounds.
    """

    REMEMBERED = 1024

    def __init__(self) -> None:
        self._versions: OrderedDict[TableRef, int] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, table: TableRef, version: int) -> None:
        with self._lock:
            self._versions[table] = max(version, self._versions.get(table, version))
            self._versions.move_to_end(table)
            while len(self._versions) > self.REMEMBERED:
                self._versions.popitem(last=False)

    def get(self, table: TableRef) -> int | None:
        with self._lock:
            return self._versions.get(table)

    def header(self) -> str:
        """The ``lake-min-versions`` value ("" when nothing was committed)."""
        with self._lock:
            recent = dict(reversed(self._versions.items()))
        return format_min_versions(recent)

    def metadata(self) -> list[tuple[str, str]]:
        """The request metadata carrying :meth:`header` (none when empty)."""
        value = self.header()
        return [(MIN_VERSIONS_HEADER, value)] if value else []


class Transport(ABC):
    """How a client reaches Query: every call of :class:`~lake_sdk.AsyncClient` goes here.

    ``url``, ``options`` and ``committed`` (the versions this client's
    appends committed, for read-your-writes) are plain attributes. Streams
    are objects with pyarrow's ``read_chunk()`` (raising StopIteration at the
    end) and ``cancel()``; their failures are Lake errors.
    """

    url: str
    options: ConnectOptions
    committed: CommittedVersions

    @abstractmethod
    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until Query answers; Unavailable if it does not within ``timeout_s``."""

    @abstractmethod
    async def action(self, name: str, body: bytes) -> bytes:
        """One Lake DoAction and its single result body."""

    @abstractmethod
    async def flight_info(self, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        """Plan a statement (GetFlightInfo)."""

    @abstractmethod
    def at(self, locations: Sequence[flight.Location]) -> Transport:
        """The transport that redeems an endpoint with ``locations`` (none: this one)."""

    @abstractmethod
    async def stream(self, ticket: flight.Ticket) -> tuple[Any, Trailers]:
        """A DoGet stream and the trailer sink its later failures fill."""

    @abstractmethod
    async def append(
        self,
        descriptor: flight.FlightDescriptor,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
    ) -> protocol.AppendResult:
        """One append (DoPut); records the committed version in ``committed``."""

    @abstractmethod
    async def ingest(
        self, descriptor: flight.FlightDescriptor, reader: pa.RecordBatchReader
    ) -> protocol.IngestResult:
        """One bulk ingest (DoPut) streaming ``reader``."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connection (idempotent)."""


class Connection(Transport):
    """One Flight client to Query, shared by a client and its clones.

    Blocking pyarrow calls run on worker threads so the event loop never waits
    on the network. Building it sends nothing; :meth:`wait_ready` does.
    """

    def __init__(self, url: str, options: ConnectOptions) -> None:
        self.url = url
        self.options = options
        self._client = options.flight_client(url, flight_location(url))
        self._closed = False
        #: Connections to the servers endpoint locations named, by location URI.
        self._located: dict[str, Connection] = {}
        #: What appends through this connection committed (sent with statements).
        self.committed = CommittedVersions()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Connection({self.url!r}, {self.options!r})"

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a worker thread; a pyarrow failure becomes its Lake error."""
        self._check_open()
        with calling() as trailers:
            try:
                return await asyncio.to_thread(fn, *args)
            except (flight.FlightError, pa.ArrowException) as exc:
                error = lake_error(exc, trailers)
        if isinstance(error, Unimplemented):
            error = await self._wrong_service(error)
        raise error from None

    def _check_open(self) -> None:
        """Refuse a call after :meth:`close` as the caller's state, not as a bad argument.

        pyarrow's own "FlightClient is closed" is an ArrowInvalid, which would
        reach the caller as InvalidArgument.
        """
        if self._closed:
            raise FailedPrecondition(f"the client of {self.url} is closed: make a new client")

    async def _wrong_service(self, error: Unimplemented) -> LakeError:
        """``error``, or one naming the service reached when this is not Query.

        A Flight server that does not implement a Query call is most often
        Metasrv at the address Query was meant to have; its action list says so.
        """
        try:
            actions = await asyncio.to_thread(lambda: list(self._client.list_actions()))
        except (flight.FlightError, pa.ArrowException):
            return error
        names = {action.type for action in actions}
        if protocol.CATALOG_SNAPSHOT in names and protocol.TABLE_SCHEMA not in names:
            return Unimplemented(
                f"{self.url} is Lake Metasrv (the commit authority), not Lake Query: "
                "point the SDK at Query's address (`lake query --addr`, "
                "127.0.0.1:50051 by default)"
            )
        return error

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until Query answers; Unavailable names the endpoint if it never does."""
        try:
            await self.call(self._client.wait_for_available, timeout_s)
        except Unavailable as error:
            raise Unavailable(f"Lake Query at {self.url} is not reachable: {error}") from None

    async def action(self, name: str, body: bytes) -> bytes:
        """One Lake DoAction and its single result body."""
        with client_span(_FLIGHT + "DoAction"):
            results = await self.call(
                lambda: list(self._client.do_action(flight.Action(name, body)))
            )
        if not results:
            raise LakeError(f"Query sent no result for {name}")
        data: bytes = results[0].body.to_pybytes()
        return data

    async def flight_info(self, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        """Plan a statement, sending this client's committed versions with it."""
        options = flight.FlightCallOptions(
            headers=[(k.encode(), v.encode()) for k, v in self.committed.metadata()]
        )
        with client_span(_FLIGHT + "GetFlightInfo", {**_DB, "db.operation.name": "plan"}):
            return await self.call(self._client.get_flight_info, descriptor, options)

    def at(self, locations: Sequence[flight.Location]) -> Connection:
        """The connection that redeems an endpoint with ``locations`` (none: this one).

        The first location is used, with this connection's credentials and
        TLS settings. A TLS connection never follows a plaintext location: the
        bearer token would cross the network in the clear.
        """
        if not locations:
            return self
        uri = locations[0].uri
        uri = uri.decode() if isinstance(uri, bytes) else str(uri)
        if uri.startswith(_REUSE):
            return self
        with self._lock:
            found = self._located.get(uri)
            if found is not None:
                return found
            endpoint = parse_endpoint(uri)
            if endpoint is None:
                raise InvalidArgument(
                    f"Query named an endpoint location the SDK cannot dial: {uri!r}"
                )
            mine = parse_endpoint(self.url)
            if mine is not None and mine.tls and not endpoint.tls:
                raise InvalidArgument(
                    f"Query at {self.url} (TLS) named a plaintext endpoint location {uri!r}"
                )
            found = self._located[uri] = Connection(uri, self.options)
            return found

    def do_get(self, ticket: flight.Ticket) -> flight.FlightStreamReader:
        """A blocking DoGet (for callers without an event loop, e.g. Ray's workers).

        Run it inside :func:`~lake_sdk._errors.calling` to map its failures.
        """
        self._check_open()
        return self._client.do_get(ticket)

    async def stream(self, ticket: flight.Ticket) -> tuple[flight.FlightStreamReader, Trailers]:
        """A DoGet stream and the trailer sink its later failures fill."""
        self._check_open()
        with (
            calling() as trailers,
            client_span(_FLIGHT + "DoGet", {**_DB, "db.operation.name": "fetch"}),
        ):
            try:
                reader = await asyncio.to_thread(self._client.do_get, ticket)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, trailers) from None
        return reader, trailers

    async def append(
        self,
        descriptor: flight.FlightDescriptor,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
    ) -> protocol.AppendResult:
        """One DoPut; a failure is a Lake error whose outcome a codeless failure leaves unknown."""
        self._check_open()
        with (
            calling() as trailers,
            client_span(_FLIGHT + "DoPut", {**_DB, "db.operation.name": "append"}),
        ):
            try:
                result = await asyncio.to_thread(self._put, descriptor, schema, batches)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, trailers, commit=True) from None
        self.committed.record(result.table, result.version)
        return result

    def _put(
        self,
        descriptor: flight.FlightDescriptor,
        schema: pa.Schema,
        batches: Sequence[pa.RecordBatch],
    ) -> protocol.AppendResult:
        return self._do_put(descriptor, schema, batches, protocol.AppendResult, "append")

    async def ingest(
        self, descriptor: flight.FlightDescriptor, reader: pa.RecordBatchReader
    ) -> protocol.IngestResult:
        """One bulk-ingest DoPut streaming ``reader`` (:mod:`lake_sdk._ingest`)."""
        self._check_open()
        with (
            calling() as trailers,
            client_span(_FLIGHT + "DoPut", {**_DB, "db.operation.name": "ingest"}),
        ):
            try:
                return await asyncio.to_thread(self._ingest, descriptor, reader)
            except (flight.FlightError, pa.ArrowException) as exc:
                raise lake_error(exc, trailers, commit=True) from None

    def _ingest(
        self, descriptor: flight.FlightDescriptor, reader: pa.RecordBatchReader
    ) -> protocol.IngestResult:
        from lake_sdk._ingest import slices

        return self._do_put(
            descriptor, reader.schema, slices(reader), protocol.IngestResult, "ingest", end=True
        )

    def _do_put(
        self,
        descriptor: flight.FlightDescriptor,
        schema: pa.Schema,
        batches: Iterable[pa.RecordBatch],
        result: type[_Result],
        what: str,
        *,
        end: bool = False,
    ) -> _Result:
        """One DoPut: send ``batches``, then decode Query's one reply as ``result``.

        With ``end`` (an ingest), the batches are followed by the end marker
        (:data:`~lake_core.protocol.INGEST_END`). If the caller's reader raises,
        its exception is the one raised and the close's own error dropped:
        pyarrow's writer cannot cancel the call, but the stream it closes lacks
        the marker, so an ingest commits nothing. A refusal while sending comes
        with the close, as the server's own status.
        """
        writer, replies = self._client.do_put(descriptor, schema)
        source = iter(batches)
        reader_failed = False
        try:
            while True:
                try:
                    batch = next(source)
                except StopIteration:
                    break
                except BaseException:
                    reader_failed = True
                    raise
                writer.write_batch(batch)
            if end:
                writer.write_metadata(protocol.INGEST_END)
            writer.done_writing()
            metadata = replies.read()
        finally:
            if reader_failed:
                with contextlib.suppress(Exception):
                    writer.close()
            else:
                writer.close()
        if metadata is None:
            raise LakeError(f"Query acknowledged the {what} without a result")
        return protocol.decode(result, metadata.to_pybytes())

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            with self._lock:
                located, self._located = list(self._located.values()), {}
            for connection in located:
                await connection.close()
            await asyncio.to_thread(self._client.close)
