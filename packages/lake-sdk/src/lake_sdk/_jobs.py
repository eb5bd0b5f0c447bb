"""Durable query jobs from the SDK: submit, checkpoint a handle, resume anywhere.

``client.jobs`` (an :class:`AsyncJobs` on :class:`~lake_sdk.AsyncClient`, a
:class:`~lake_sdk.Jobs` on the blocking :class:`~lake_sdk.Client`) runs SQL
as a server-side job (``LAKE_ASYNC_QUERIES`` on the server) that outlives the
connection: ``submit``, ``poll``, ``resume``, ``cancel``, or ``query`` to
submit, wait and stream in one call.

pyarrow's Flight client has no PollFlightInfo, so polls go over a plain gRPC
channel to the same endpoint, with the same bearer token and TLS settings,
asking for Lake's error codes and carrying the caller's W3C trace context
(the server keeps it with the job, so the worker's span joins the trace). Result parts are then read with pyarrow's
DoGet like any interactive result, one endpoint after the other.

A :class:`JobHandle` holds only the sealed capability bytes the server
issued and their expiry (``to_json``/``from_json``, at most 16 KiB), plus the
state of the last poll. Its ``repr`` never shows the capability.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from lake_core import protocol
from lake_core.endpoints import parse_endpoint
from lake_core.errors import (
    WANTS_CODES,
    WIRE_CLASSES,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LakeError,
    error_from_wire,
)
from lake_core.proto import flight_pb2, flight_sql_pb2
from lake_core.telemetry.propagation import client_span
from lake_sdk._results import AsyncQueryResult
from lake_sdk._transport import Transport

__all__ = ["MAX_HANDLE_BYTES", "AsyncJobResult", "AsyncJobs", "JobCalls", "JobHandle"]

#: The largest handle ``from_json`` accepts (and the server issues).
MAX_HANDLE_BYTES = 16 * 1024
HANDLE_VERSION = 1
#: Submission attempts, all with one job id (a lost reply never runs the SQL twice).
SUBMIT_ATTEMPTS = 4
#: How long each poll of ``wait`` asks the replica to hold it (it holds at most 5 s).
WAIT_POLL_MS = 1_000

AsyncState = Literal["pending", "running", "done", "cancelled", "failed"]
_STATES = ("pending", "running", "done", "cancelled", "failed")
_POLL = "/arrow.flight.protocol.FlightService/PollFlightInfo"
#: OpenTelemetry database conventions (as the transport's): a closed operation name, never SQL.
_DB = {"db.system.name": "lake"}


@dataclass(frozen=True, repr=False)
class JobHandle:
    """A resumable durable job: opaque capability bytes, their expiry, the last state."""

    capability: bytes
    expires_at: float
    state: AsyncState = "pending"
    #: The typed error of a ``failed`` job.
    error: LakeError | None = field(default=None, compare=False)
    _endpoints: tuple[bytes, ...] = field(default=(), compare=False)

    def __repr__(self) -> str:
        return f"JobHandle(state={self.state!r}, expires_at={self.expires_at:.0f}, capability=***)"

    def to_json(self) -> str:
        """Versioned JSON to checkpoint: the capability and its expiry only."""
        return json.dumps(
            {
                "v": HANDLE_VERSION,
                "capability": base64.b64encode(self.capability).decode("ascii"),
                "expires_at": self.expires_at,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> JobHandle:
        """Rebuild a handle saved with :meth:`to_json` (state ``pending`` until polled)."""
        if len(text) > 2 * MAX_HANDLE_BYTES:
            raise InvalidArgument("a job handle is at most 16 KiB")
        try:
            doc = json.loads(text)
            version = doc.get("v")
            # type(): True == 1 in Python, and a bool is no handle version.
            if type(version) is not int or version != HANDLE_VERSION:
                raise InvalidArgument("a job handle of an unknown version")
            capability = base64.b64decode(doc["capability"], validate=True)
            expires = float(doc["expires_at"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InvalidArgument("not a job handle") from None
        if not math.isfinite(expires):
            # NaN compares false with every time: such a handle would never expire.
            raise InvalidArgument("not a job handle: its expiry is not a time")
        if not 0 < len(capability) <= MAX_HANDLE_BYTES:
            raise InvalidArgument("a job handle is at most 16 KiB")
        return cls(capability=capability, expires_at=expires)

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at


def _statement(sql: str) -> bytes:
    from google.protobuf import any_pb2

    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    data: bytes = wrapper.SerializeToString()
    return data


class AsyncJobResult(AsyncQueryResult):
    """A finished job's result: the batches of every part, in order; ``schema`` before the first.

    An :class:`~lake_sdk.AsyncQueryResult` (iterate it, ``to_table``,
    ``to_pandas``, ``to_polars``) that also carries the job's ``handle``.
    """

    def __init__(
        self,
        connection: Transport,
        handle: JobHandle,
        schema: pa.Schema,
        release: JobCalls | None = None,
    ) -> None:
        super().__init__(None, schema, {})
        self._connection = connection
        self.handle = handle
        self.schema = schema
        self._current: AsyncQueryResult | None = None
        self._iterator: AsyncIterator[pa.RecordBatch] | None = None
        # jobs.query owns its job: once every part is read, its storage is released.
        self._release = release

    def __repr__(self) -> str:
        return f"AsyncJobResult({len(self.handle._endpoints)} parts)"

    def __aiter__(self) -> AsyncIterator[pa.RecordBatch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[pa.RecordBatch]:
        for ticket in self.handle._endpoints:
            reader, trailers = await self._connection.stream(flight.Ticket(ticket))
            self._current = AsyncQueryResult(reader, self.schema, trailers)
            async for batch in self._current:
                yield batch
        self._current = None
        if self._release is not None:
            await self._release.cancel(self.handle)

    async def next_batch(self) -> pa.RecordBatch | None:
        """The next batch, or None after the last part."""
        if self._iterator is None:
            self._iterator = self._batches()
        return await anext(self._iterator, None)

    async def to_table(self) -> pa.Table:
        batches = [batch async for batch in self]
        return pa.Table.from_batches(batches, schema=self.schema)

    def cancel(self) -> None:
        """Stop reading the current part early (the job and its result stay)."""
        if self._current is not None:
            self._current.cancel()


class JobCalls:
    """Submits, polls and cancels durable jobs over one connection (shared with clones)."""

    def __init__(self, connection: Transport, poll_interval_s: float = 0.005) -> None:
        self._connection = connection
        self._poll_interval_s = poll_interval_s
        self._channel: grpc.Channel | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"JobCalls({self._connection.url!r})"

    def _open(self) -> grpc.Channel:
        if self._channel is None:
            endpoint = parse_endpoint(self._connection.url)
            if endpoint is None:
                raise InvalidArgument(f"not a Lake endpoint: {self._connection.url!r}")
            options = self._connection.options
            channel_options = [
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                # Its own connections, not a process-wide shared one that another
                # client left in reconnect backoff (see lake_core.metaclient).
                ("grpc.use_local_subchannel_pool", 1),
            ]
            if endpoint.tls:
                credentials = grpc.ssl_channel_credentials(root_certificates=options.ca_pem)
                if options.server_name:
                    channel_options.append(("grpc.ssl_target_name_override", options.server_name))  # type: ignore[arg-type]
                self._channel = grpc.secure_channel(endpoint.target, credentials, channel_options)
            else:
                self._channel = grpc.insecure_channel(endpoint.target, channel_options)
        return self._channel

    def _metadata(self, job_id: str | None, wait_ms: int = 0) -> list[tuple[str, str]]:
        metadata = [WANTS_CODES, (protocol.ASYNC_STATES_HEADER, "1")]
        if wait_ms > 0:
            metadata.append((protocol.ASYNC_WAIT_HEADER, str(wait_ms)))
        token = self._connection.options.bearer_token
        if token is not None:
            metadata.append(("authorization", f"Bearer {token.reveal()}"))
        if job_id is not None:
            metadata.append((protocol.ASYNC_JOB_ID_HEADER, job_id))
            # A submission plans: it reads this client's own appends (lake_core.min_versions).
            metadata.extend(self._connection.committed.metadata())
        return metadata

    def _poll_call(
        self, descriptor: flight_pb2.FlightDescriptor, job_id: str | None, wait_ms: int = 0
    ) -> flight_pb2.PollInfo:
        call = self._open().unary_unary(
            _POLL,
            request_serializer=flight_pb2.FlightDescriptor.SerializeToString,
            response_deserializer=flight_pb2.PollInfo.FromString,
        )
        # Runs on the thread asyncio.to_thread started, with a copy of the caller's context.
        operation = "submit" if job_id is not None else "poll"
        with client_span(_POLL, {**_DB, "db.operation.name": operation}) as headers:
            try:
                info: flight_pb2.PollInfo = call(
                    descriptor, metadata=[*self._metadata(job_id, wait_ms), *headers], timeout=60
                )
            except grpc.RpcError as exc:
                trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
                raise error_from_wire(exc.code(), exc.details() or "", trailers) from None
        return info

    def _check_open(self) -> None:
        """Refuse a job call after :meth:`close`, as the client's other calls do.

        Without it a closed client's next poll would open a fresh channel and
        submit SQL as if the client were still open.
        """
        if self._closed:
            raise FailedPrecondition(
                f"the client of {self._connection.url} is closed: make a new client"
            )

    async def _poll(
        self, descriptor: flight_pb2.FlightDescriptor, job_id: str | None, wait_ms: int = 0
    ) -> tuple[JobHandle, pa.Schema]:
        self._check_open()
        info = await asyncio.to_thread(self._poll_call, descriptor, job_id, wait_ms)
        return _handle(info, descriptor.cmd if job_id is None else b"")

    async def submit(self, sql: str) -> tuple[JobHandle, pa.Schema]:
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidArgument("SQL must be a non-empty string")
        job_id = secrets.token_hex(16)  # one id for every attempt
        descriptor = flight_pb2.FlightDescriptor(
            type=flight_pb2.FlightDescriptor.CMD, cmd=_statement(sql)
        )
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                return await self._poll(descriptor, job_id)
            except LakeError as error:
                if not error.retryable or attempt == SUBMIT_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
        raise Internal("unreachable")

    async def poll(self, handle: JobHandle, wait_ms: int = 0) -> tuple[JobHandle, pa.Schema]:
        if not isinstance(handle, JobHandle):
            raise InvalidArgument("jobs.poll needs a JobHandle")
        descriptor = flight_pb2.FlightDescriptor(
            type=flight_pb2.FlightDescriptor.CMD, cmd=handle.capability
        )
        return await self._poll(descriptor, None, wait_ms)

    async def wait(self, handle: JobHandle) -> tuple[JobHandle, pa.Schema]:
        """Poll until the job is finished; raise its error when it failed or was cancelled.

        Each poll asks the replica to hold it until the job finishes (at most
        :data:`WAIT_POLL_MS`): the replica answers the moment its worker
        records the end, with one call a second instead of one every few
        milliseconds. A replica that does not hold polls (older, or another
        Flight SQL server) answers at once, and the polls back off as before.
        """
        delay = self._poll_interval_s
        while True:
            began = time.monotonic()
            handle, schema = await self.poll(handle, WAIT_POLL_MS)
            if handle.state == "done":
                return handle, schema
            if handle.error is not None:
                raise handle.error
            if time.monotonic() - began < WAIT_POLL_MS / 2000:
                # Answered early while still running: a replica that does not hold polls.
                await asyncio.sleep(delay)
                # Short first polls, then slower: completion is seen within ~25% of the run.
                delay = min(1.0, delay * 1.25)

    async def cancel(self, handle: JobHandle) -> bool:
        """CancelFlightInfo; True when the job is (now) cancelled."""
        if not isinstance(handle, JobHandle):
            raise InvalidArgument("jobs.cancel needs a JobHandle")
        self._check_open()
        info = flight_pb2.FlightInfo(
            flight_descriptor=flight_pb2.FlightDescriptor(
                type=flight_pb2.FlightDescriptor.CMD, cmd=handle.capability
            )
        )
        request = flight_pb2.CancelFlightInfoRequest(info=info)
        body = await self._connection.action("CancelFlightInfo", request.SerializeToString())
        result = flight_pb2.CancelFlightInfoResult.FromString(body)
        return bool(result.status == flight_pb2.CANCEL_STATUS_CANCELLED)

    def close(self) -> None:
        """Close the channel; closing is final (the client is closed for clones too)."""
        self._closed = True
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _handle(info: flight_pb2.PollInfo, previous: bytes) -> tuple[JobHandle, pa.Schema]:
    schema = pa.ipc.read_schema(pa.py_buffer(info.info.schema))
    outcome: dict[str, Any] = {}
    if info.info.app_metadata:
        try:
            outcome = json.loads(info.info.app_metadata)
        except ValueError:
            outcome = {}
    state = outcome.get("state")
    if state not in _STATES:
        state = "running" if info.HasField("flight_descriptor") else "done"
    error = None
    if state in ("failed", "cancelled"):
        cls = WIRE_CLASSES.get(str(outcome.get("code", "")), Internal)
        error = cls(str(outcome.get("message", "the job failed")))
    if info.HasField("flight_descriptor"):
        capability = info.flight_descriptor.cmd
    elif info.info.HasField("flight_descriptor"):
        capability = info.info.flight_descriptor.cmd
    else:
        capability = previous  # a finished job's outcome carries no new handle
    handle = JobHandle(
        capability=capability,
        expires_at=float(info.expiration_time.seconds),
        state=cast(AsyncState, state),
        error=error,
        _endpoints=tuple(e.ticket.ticket for e in info.info.endpoint) if state == "done" else (),
    )
    return handle, schema


class AsyncJobs:
    """``AsyncClient.jobs``: durable server-side query jobs (``LAKE_ASYNC_QUERIES``)."""

    def __init__(self, connection: Transport, calls: JobCalls) -> None:
        self._connection = connection
        self._calls = calls

    def __repr__(self) -> str:
        return f"AsyncJobs({self._connection.url!r})"

    async def query(self, sql: str) -> AsyncJobResult:
        """Run SQL as a durable job and stream its result; the job is released once read.

        The job belongs to this call: if the call is cancelled (or Ctrl-C
        interrupts the blocking client) while it waits, the job is cancelled too.
        """
        handle, _ = await self._calls.submit(sql)
        try:
            handle, schema = await self._calls.wait(handle)
        except asyncio.CancelledError:
            # Nobody else holds this handle: a job left running would only cost the server.
            await asyncio.shield(self._calls.cancel(handle))
            raise
        return AsyncJobResult(self._connection, handle, schema, release=self._calls)

    async def submit(self, sql: str) -> JobHandle:
        """Submit SQL as a durable job; checkpoint ``handle.to_json()`` to resume it anywhere."""
        handle, _ = await self._calls.submit(sql)
        return handle

    async def resume(self, handle: JobHandle) -> AsyncJobResult:
        """Wait for a submitted job (through any replica) and stream its result.

        Cancelling the wait leaves the job running: resume it again later.
        """
        handle, schema = await self._calls.wait(handle)
        return AsyncJobResult(self._connection, handle, schema)

    async def wait(self, handle: JobHandle) -> JobHandle:
        """Wait until the job is done (through any replica); the final handle, to read later.

        Raises the job's error if it failed or was cancelled. The replica holds
        each poll until the job ends (up to a second), so the end is seen as
        soon as it is recorded, with about one call a second. Cancelling the
        wait leaves the job running.
        """
        finished, _ = await self._calls.wait(handle)
        return finished

    async def poll(self, handle: JobHandle) -> JobHandle:
        """One non-blocking poll: the refreshed handle (``state``, and ``error`` if failed)."""
        refreshed, _ = await self._calls.poll(handle)
        return refreshed

    async def cancel(self, handle: JobHandle) -> bool:
        """Cancel a job through CancelFlightInfo; its result parts are never served after."""
        return await self._calls.cancel(handle)
