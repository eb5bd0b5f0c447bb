"""Durable async queries as Query's Flight handler sees them.

- Submission (PollFlightInfo of a SQL command): plan and pin now, reserve a
  tenant slot, write the sealed job, answer with a handle to poll. The id
  comes from the ``lake-async-job-id`` header when the client sends one, so a
  retried submission finds its job instead of running the SQL again.
- Poll (PollFlightInfo of a handle descriptor): one point read; a done job
  answers with one endpoint per part, each a sealed part ticket.
- Cancel (CancelFlightInfo): marks the job cancelled and removes its results;
  a worker of this replica stops at once (mid-batch), one elsewhere at its
  next lease renewal.
- DoGet of a part ticket: the framing-checked part, only while the job is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError

from lake_core.errors import (
    WIRE_CLASSES,
    DataCorrupted,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LakeError,
    NotFound,
    PermissionDenied,
    QueryCancelled,
)
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.protocol import ASYNC_MAX_POLL_WAIT_MS
from lake_core.schemas import schema_from_base64, schema_to_base64, schema_to_ipc
from lake_core.telemetry.propagation import durable_context
from lake_core.tickets import TicketSealer
from lake_query.jobs.framing import checked_frames, checked_messages
from lake_query.jobs.model import (
    JOB_ID,
    RETENTION_SECS,
    JobBody,
    JobRecord,
    JobSeal,
    ResultManifest,
)
from lake_query.jobs.quotas import TenantSlots
from lake_query.jobs.results import ResultStore
from lake_query.jobs.settings import AsyncSettings
from lake_query.jobs.store import ACTIVE, JOBS, StateStore
from lake_query.jobs.tags import PartTag
from lake_query.jobs.workers import Execute, Jobs, WorkerPool
from lake_query.planning import QuerySpec
from lake_query.planning.batches import prefetch

__all__ = ["PART", "AsyncQueries", "is_handle", "open_stores"]

#: Ticket body kind of an async result part.
PART = "ap"
#: Messages a part's reader thread runs ahead of the network.
PART_PREFETCH = 2
#: A held poll reads its job's record again at least this often (a job another replica runs).
POLL_RECHECK_S = 0.1

#: Plans a descriptor for a principal: (result schema, the pinned statement).
Plan = Callable[[pb.FlightDescriptor, Principal], Awaitable[tuple[pa.Schema, QuerySpec]]]
#: The statement a descriptor names (its SQL and bound parameters), decoded without
#: planning: a retried submission is compared with its job by it.
Statement = Callable[[pb.FlightDescriptor, Principal], Awaitable[QuerySpec]]


_HANDLE_MAGIC = b"LKT1"


def is_handle(cmd: bytes) -> bool:
    """Whether a descriptor's command is an async handle (a sealed ticket, not an Any).

    A handle with one byte of its magic changed still counts, so that it is refused
    as the damaged handle it is (Unauthenticated) rather than parsed as a statement:
    a Flight SQL command (an Any, starting ``0a <length> "ty"``) differs from the
    magic in at least three of its first four bytes.
    """
    if len(cmd) < len(_HANDLE_MAGIC):
        return False
    changed = sum(a != b for a, b in zip(cmd, _HANDLE_MAGIC, strict=False))
    return changed <= 1


def _manifest(raw: bytes) -> ResultManifest:
    """A stored manifest; one of another Lake version, or a damaged one, is said as such."""
    try:
        return ResultManifest.model_validate_json(raw)
    except ValidationError:
        pass
    try:
        version = json.loads(raw).get("schema_version")
    except (ValueError, AttributeError):
        version = None
    if version == 1:  # schema 1 parts carried a plain SHA-256
        raise FailedPrecondition(
            "the async result was stored by an incompatible Lake Query version; "
            "submit the query again"
        )
    raise DataCorrupted("the async query's result manifest is damaged")


def _timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromSeconds(int(seconds))
    return stamp


class AsyncQueries:
    """Submission, polls, cancellation and part streams over one state and result store."""

    def __init__(
        self,
        settings: AsyncSettings,
        state: StateStore,
        results: ResultStore,
        *,
        seal: JobSeal,
        tickets: TicketSealer,
        execute: Execute,
    ) -> None:
        self.settings = settings
        self._state = state
        self._results = results
        self._seal = seal
        self._tickets = tickets
        self._jobs = Jobs(state)
        self._slots = TenantSlots(state, settings.max_outstanding_per_tenant)
        self.pool = WorkerPool(settings, self._jobs, results, seal, self._slots, execute)
        # Part streams are bounded by admission; a thread each while they run.
        self._readers = ThreadPoolExecutor(thread_name_prefix="lake-async-read")

    def __repr__(self) -> str:
        return f"AsyncQueries({self._state!r}, {self._results!r}, {self.pool!r})"

    def start(self) -> None:
        self.pool.start()

    async def close(self) -> None:
        await self.pool.close()
        self._readers.shutdown(wait=False, cancel_futures=True)
        await self._state.close()
        await self._results.close()

    # PollFlightInfo.

    async def submit(
        self,
        descriptor: pb.FlightDescriptor,
        principal: Principal,
        job_id: str | None,
        plan: Plan,
        statement: Statement,
        *,
        states: bool = False,
    ) -> pb.PollInfo:
        if job_id is not None and not JOB_ID.fullmatch(job_id):
            raise InvalidArgument("an async job id must be 32 lowercase hex digits")
        job_id = job_id or secrets.token_hex(16)
        existing = await self._jobs.get(job_id)
        if existing is not None:
            incoming = await statement(descriptor, principal)
            return await self._resubmitted(existing[0], principal, incoming, states)
        schema, spec = await plan(descriptor, principal)
        ceiling = self.settings.max_result_bytes
        body = JobBody(
            principal=principal,
            spec=spec,
            schema_ipc=schema_to_base64(schema),
            max_result_bytes=ceiling,
        )
        # Tenant key and digest under the key the body is sealed with (the active one),
        # which later readers take from the sealed body: a rotation does not move them.
        sealed = self._seal.seal_body(body)
        key_id = self._seal.sealed_key_id(sealed)
        tenant = self._seal.tenant_key(principal, key_id)
        now = time.time()
        # The PollFlightInfo span's context (a child of the client's): the worker continues it.
        traceparent, tracestate = durable_context()
        record = JobRecord(
            job_id=job_id,
            tenant_key=tenant,
            request_digest=self._seal.request_digest(principal, spec, key_id),
            sealed=sealed,
            submitted_at=now,
            expires_at=now + RETENTION_SECS,
            max_result_bytes=ceiling,
            traceparent=traceparent,
            tracestate=tracestate,
        )
        # The slot first: a crash after it conservatively holds it until reconciled.
        others = [k for k in self._seal.tenant_keys(principal) if k != tenant]
        await self._slots.reserve(tenant, job_id, also=others)
        await self._state.write(ACTIVE, job_id, {}, None)
        if not await self._state.write(JOBS, job_id, record.model_dump(mode="json"), None):
            found = await self._jobs.get(job_id)  # a concurrent retry wrote it first
            if found is None:
                raise Internal("the async job could not be stored")
            return await self._resubmitted(found[0], principal, spec, states)
        self.pool.wake()
        return self._poll_info(record, body, principal, None)

    async def _resubmitted(
        self, record: JobRecord, principal: Principal, incoming: QuerySpec, states: bool
    ) -> pb.PollInfo:
        """A submission whose job id is taken: the same caller's same statement gets its job."""
        if not self._seal.owns(record, principal):
            raise PermissionDenied("that async job id belongs to another caller")
        body = self._seal.open_body(record)
        if body.principal.principal_id != principal.principal_id:
            raise PermissionDenied("that async job id belongs to another caller")
        digest = self._seal.request_digest(principal, incoming, self._seal.key_id(record))
        if not hmac.compare_digest(record.request_digest, digest):
            raise InvalidArgument("that async job id was used for a different statement")
        return await self._answer(record, body, principal, states)

    async def poll(
        self, handle: bytes, principal: Principal, *, states: bool = False, wait_s: float = 0.0
    ) -> pb.PollInfo:
        """The job's state; with ``wait_s`` > 0, held until it finishes or that long passes.

        A held poll wakes as soon as this replica's worker writes the job's
        record and reads it again at least every :data:`POLL_RECHECK_S` (a
        job another replica runs); the checks are made again on every read.
        """
        job_id = self._seal.open_handle(handle, principal)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait_s, 0.0), ASYNC_MAX_POLL_WAIT_MS / 1000)
        while True:
            found = await self._jobs.get(job_id)
            if found is None or found[0].expired():
                raise NotFound("the async query is unknown or has expired")
            record = found[0]
            if not self._seal.owns(record, principal):
                raise PermissionDenied("the async query belongs to another caller")
            left = deadline - loop.time()
            if record.terminal or left <= 0:
                break
            await self._jobs.written(job_id, min(left, POLL_RECHECK_S))
        return await self._answer(record, self._seal.open_body(record), principal, states)

    async def _answer(
        self, record: JobRecord, body: JobBody, principal: Principal, states: bool
    ) -> pb.PollInfo:
        error: LakeError | None = None
        if record.state == "cancelled":
            error = QueryCancelled("the async query was cancelled")
        elif record.state == "failed":
            cls = WIRE_CLASSES.get(record.error_code or "", Internal)
            error = cls(record.error_message or "the async query failed")
        if error is not None and not states:
            raise error
        if error is not None:
            # Lake's client reads the outcome here: the poll itself succeeded.
            outcome = {"state": record.state, "code": error.code, "message": str(error)}
            info = pb.FlightInfo(
                schema=schema_to_ipc(schema_from_base64(body.schema_ipc)),
                total_records=-1,
                total_bytes=-1,
                app_metadata=json.dumps(outcome).encode(),
            )
            return pb.PollInfo(
                info=info, progress=1.0, expiration_time=_timestamp(record.expires_at)
            )
        manifest = None
        if record.state == "done" and record.manifest is not None:
            raw = await self._results.read_bytes(record.manifest)
            if raw is None:
                raise NotFound("the async query's result is gone")
            manifest = _manifest(raw)
        return self._poll_info(record, body, principal, manifest)

    def _poll_info(
        self,
        record: JobRecord,
        body: JobBody,
        principal: Principal,
        manifest: ResultManifest | None,
    ) -> pb.PollInfo:
        handle = pb.FlightDescriptor(
            type=pb.FlightDescriptor.CMD, cmd=self._seal.seal_handle(principal, record.job_id)
        )
        schema = schema_from_base64(body.schema_ipc)
        info = pb.FlightInfo(
            schema=schema_to_ipc(schema),
            flight_descriptor=handle,
            total_records=-1 if manifest is None else manifest.rows,
            total_bytes=-1 if manifest is None else manifest.bytes,
            ordered=True,
            app_metadata=json.dumps({"state": record.state}).encode(),
        )
        expires = _timestamp(record.expires_at)
        if manifest is None:
            return pb.PollInfo(
                info=info,
                flight_descriptor=handle,
                progress=0.0 if record.state == "pending" else 0.5,
                expiration_time=expires,
            )
        for index, part in enumerate(manifest.parts):
            claims: dict[str, Any] = {
                "k": PART,
                "j": record.job_id,
                "m": record.manifest,
                "i": index,
                "a": manifest.attempt,
                "n": part.name,
                "b": part.bytes,
                "t": part.tag.model_dump(),
            }
            ticket = self._tickets.seal(principal, claims)
            info.endpoint.append(pb.FlightEndpoint(ticket=pb.Ticket(ticket=ticket)))
        return pb.PollInfo(info=info, progress=1.0, expiration_time=expires)

    # CancelFlightInfo.

    def _job_of(self, info: pb.FlightInfo, principal: Principal) -> str:
        if info.HasField("flight_descriptor") and is_handle(info.flight_descriptor.cmd):
            return self._seal.open_handle(info.flight_descriptor.cmd, principal)
        for endpoint in info.endpoint:
            body = self._tickets.open(endpoint.ticket.ticket, principal)
            if body.get("k") == PART and isinstance(body.get("j"), str):
                return str(body["j"])
        raise InvalidArgument("CancelFlightInfo needs the FlightInfo of an async query")

    async def cancel(self, info: pb.FlightInfo, principal: Principal) -> int:
        """Cancel the job ``info`` names; the CancelStatus to answer."""
        job_id = self._job_of(info, principal)
        found = await self._jobs.get(job_id)
        if found is None or not self._seal.owns(found[0], principal):
            raise NotFound("the async query is unknown or has expired")
        if found[0].state == "failed":
            return pb.CANCEL_STATUS_NOT_CANCELLABLE

        def cancel(current: JobRecord) -> JobRecord | None:
            if current.state in ("cancelled", "failed"):
                return None
            return current.next(
                state="cancelled",
                cancel_requested=True,
                manifest=None,
                lease_owner=None,
                lease_token=None,
                lease_expires=0.0,
            )

        record = await self._jobs.update(job_id, cancel)
        if record is None or record.state != "cancelled":
            return pb.CANCEL_STATUS_NOT_CANCELLABLE
        self.pool.interrupt(job_id)  # running here: stop it now, not at the next renewal
        await self._results.delete_prefix(job_id)
        await self._state.remove(ACTIVE, job_id)
        await self._slots.release(record.tenant_key, job_id)
        return pb.CANCEL_STATUS_CANCELLED

    # DoGet of a part.

    async def part_messages(
        self, claims: dict[str, Any], principal: Principal
    ) -> AsyncIterator[bytes]:
        job_id, manifest, attempt = claims.get("j"), claims.get("m"), claims.get("a")
        index, name, size = claims.get("i"), claims.get("n"), claims.get("b")
        try:
            tag = PartTag.model_validate(claims.get("t"))
        except ValidationError:
            tag = None
        if not (
            isinstance(job_id, str)
            and isinstance(manifest, str)
            and isinstance(attempt, int)
            and isinstance(index, int)
            and isinstance(name, str)
            and isinstance(size, int)
            and tag is not None
        ):
            raise InvalidArgument("ticket from an incompatible Lake Query version")
        found = await self._jobs.get(job_id)
        if found is None or found[0].state == "cancelled":
            raise QueryCancelled("the async query was cancelled")
        record = found[0]
        if record.state != "done" or record.manifest != manifest:
            raise NotFound("the async query's result is gone")
        key = f"{manifest.rsplit('/', 1)[0]}/{name}"
        checker = self._seal.tags.checker(job_id, attempt, index, tag)
        try:
            blocking = self._results.read_blocking(key)
            if blocking is None:
                messages = checked_messages(self._results.read_chunks(key), size, checker)
            else:
                # One reader thread reads, checks and reframes, two messages ahead of the
                # network (at most two batches buffered); a dropped client stops it.
                messages = prefetch(
                    checked_frames(blocking, size, checker),
                    self._readers,
                    PART_PREFETCH,
                )
            async with contextlib.aclosing(messages):
                async for message in messages:
                    yield message
        except FileNotFoundError:
            raise NotFound("the async query's result is gone") from None


async def open_stores(settings: AsyncSettings) -> tuple[StateStore, ResultStore]:
    """The configured state and result stores (local directories, or DynamoDB and S3)."""
    from lake_query.jobs.dynamo import DynamoStateStore
    from lake_query.jobs.results import LocalResults, S3Results
    from lake_query.jobs.store import LocalStateStore

    if settings.mode == "local":
        assert settings.state_dir is not None
        assert settings.results_dir is not None
        return LocalStateStore(settings.state_dir), LocalResults(settings.results_dir)
    state = await DynamoStateStore(
        settings.dynamodb_table,
        endpoint_url=settings.dynamodb_endpoint,
        region=settings.region,
    ).open()
    try:
        results = await S3Results(
            settings.bucket,
            settings.result_prefix,
            endpoint_url=settings.s3_endpoint,
            region=settings.region or "us-east-1",
        ).open()
    except BaseException:
        await state.close()
        raise
    return state, results
