"""The durable job: what the state store keeps, what is sealed, what the client holds.

A :class:`JobRecord` is the only mutable thing (state, lease, result manifest);
every change is a compare-and-swap on its ``revision``. Everything about the
caller and the statement (principal, grants, SQL, parameters, the pinned
snapshot) is in ``sealed``: a ticket sealed with the fleet's key ring under
a job audience, opened only by a worker. The store sees a tenant *key* (a
keyed digest) for quotas and fairness, never the tenant, the principal or
the SQL, and never credentials or object bytes. The record may also hold the
submission's W3C trace context (``traceparent``/``tracestate``: ids, no
credentials), so the worker that runs the job continues the client's trace.

The client holds a handle: another sealed ticket naming the job, bound to the
submitting principal and tenant, redeemable on any replica.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from lake_core.errors import (
    FailedPrecondition,
    InvalidArgument,
    LakeError,
    PermissionDenied,
    Unauthenticated,
)
from lake_core.principal import Principal
from lake_core.telemetry.propagation import checked_traceparent, checked_tracestate
from lake_core.tickets import TicketKeyRing, TicketSealer, ticket_key_id
from lake_query.jobs.tags import PartTag, PartTags
from lake_query.planning import QuerySpec

__all__ = [
    "JOB_ID",
    "JOB_PRINCIPAL",
    "RETENTION_SECS",
    "TERMINAL",
    "JobBody",
    "JobRecord",
    "JobSeal",
    "JobState",
    "ManifestPart",
    "ResultManifest",
]

JobState = Literal["pending", "running", "done", "cancelled", "failed"]
TERMINAL: frozenset[str] = frozenset({"done", "cancelled", "failed"})

#: A job id: 128 bits, lowercase hex (the SDK reuses one across submission retries).
JOB_ID = re.compile(r"[0-9a-f]{32}")

#: How long a job and its result are kept after submission.
RETENTION_SECS = 24 * 3600

#: Job bodies are sealed to this service identity: the real caller is inside.
JOB_PRINCIPAL = Principal(principal_id="lake-async-worker", tenant_id="lake-async", role="user")


class JobRecord(BaseModel):
    """One job in the state store (schema 2: the byte ceiling is persisted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[2] = 2
    job_id: str
    tenant_key: str
    #: Digest of (principal, SQL, parameters): a resubmission with the same id must match.
    request_digest: str
    sealed: str
    state: JobState = "pending"
    submitted_at: float
    expires_at: float
    max_result_bytes: int
    revision: int = 0
    attempt: int = 0
    lease_owner: str | None = None
    lease_token: str | None = None
    lease_expires: float = 0.0
    cancel_requested: bool = False
    manifest: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    #: The submission's W3C context; records of earlier versions have none.
    traceparent: str | None = None
    tracestate: str | None = None

    @field_validator("traceparent", mode="before")
    @classmethod
    def _traceparent(cls, value: object) -> str | None:
        return checked_traceparent(value)  # a bad stored value is dropped, never an error

    @field_validator("tracestate", mode="before")
    @classmethod
    def _tracestate(cls, value: object) -> str | None:
        return checked_tracestate(value)

    @model_serializer(mode="wrap")
    def _without_absent_trace(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An untraced record is stored exactly as before (older replicas forbid extra keys).
        data: dict[str, Any] = handler(self)
        for key in ("traceparent", "tracestate"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at

    def next(self, **changes: Any) -> JobRecord:
        """The record after one change: the revision moves with every write."""
        return self.model_copy(update={**changes, "revision": self.revision + 1})


class JobBody(BaseModel):
    """What a sealed job carries: the caller and the planned, pinned statement."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    principal: Principal
    spec: QuerySpec
    #: The result schema advertised at submission (base64 IPC).
    schema_ipc: str
    max_result_bytes: int


class ManifestPart(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    bytes: int
    rows: int
    tag: PartTag


class ResultManifest(BaseModel):
    """The one atomic record of a finished result: every part, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: 2: parts carry a keyed tag (:mod:`lake_query.jobs.tags`); 1 carried a SHA-256.
    schema_version: Literal[2] = 2
    job_id: str
    attempt: int
    rows: int
    bytes: int
    parts: tuple[ManifestPart, ...]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class JobSeal:
    """Seals job bodies, client handles and part tickets with the ticket key ring.

    Three audiences derived from the fleet's, so a handle never opens as a
    ticket or a job body and the other way round.

    A job's tenant key and request digest are keyed by the ring key its body
    was sealed under, and that key's id is read back from the sealed body's
    header (authenticated when the body opens), not from the ring's active
    key: activating a new key (step 2 of a rotation) must not make a job
    submitted before it look like another tenant's or another statement, and
    replicas mid-rollout must agree on every job. The id is not a new record
    field, so records written before this rule and records read by replicas
    that predate it keep one format. A job whose key has left the ring fails
    with FailedPrecondition, as a part tagged under such a key does.
    """

    def __init__(self, jobs: TicketSealer, handles: TicketSealer, ring: TicketKeyRing) -> None:
        self._jobs = jobs
        self._handles = handles
        self._ring = ring
        # Tenant keys: a keyed digest, so the store cannot be joined to tenant names.
        # One digest key per ring key (the derivation is unchanged, so stored keys stay valid).
        self._keys = {
            key_id: hashlib.sha256(b"lake-async-tenant\0" + key).digest()
            for key_id, key in ring.keys.items()
        }
        #: The tags that make every stored part verifiable end to end.
        self.tags = PartTags(ring)

    def _digest_key(self, key_id: str) -> bytes:
        key = self._keys.get(key_id)
        if key is None:
            raise FailedPrecondition(
                "the async query was submitted under a ticket key this replica no longer "
                "holds; submit the query again"
            )
        return key

    @staticmethod
    def sealed_key_id(sealed: str) -> str:
        """The ring key a sealed body names (its job's tenant key and digest are keyed by it)."""
        try:
            key_id = ticket_key_id(base64.b64decode(sealed, validate=True))
        except ValueError:
            key_id = None
        if key_id is None:
            raise InvalidArgument("the async job was sealed by an incompatible replica")
        return key_id

    def key_id(self, record: JobRecord) -> str:
        return self.sealed_key_id(record.sealed)

    def tenant_key(self, principal: Principal, key_id: str | None = None) -> str:
        """The tenant's keyed digest under ``key_id`` (None: the active key, a new job's)."""
        key = self._digest_key(self._ring.active_id if key_id is None else key_id)
        mac = hmac.new(key, principal.tenant_id.encode(), hashlib.sha256)
        return mac.hexdigest()[:32]

    def tenant_keys(self, principal: Principal) -> list[str]:
        """The tenant's key under every key of the ring, the active key's first.

        A tenant's jobs are counted under all of them: during a rotation its
        outstanding jobs are split between the old key's and the new key's.
        """
        others = sorted(k for k in self._keys if k != self._ring.active_id)
        return [self.tenant_key(principal, k) for k in (self._ring.active_id, *others)]

    def tenant_keys_of(self, record: JobRecord) -> list[str]:
        """The job's tenant's keys under every ring key (active first), for fair scheduling.

        A job's stored tenant key is its sealing key's, so during a rotation one
        tenant's jobs carry two; the sealed body names the tenant. A body that
        does not open (another ring, a retired key) has only its stored key:
        running it fails at once.
        """
        try:
            return self.tenant_keys(self.open_body(record).principal)
        except (LakeError, ValueError):
            return [record.tenant_key]

    def owns(self, record: JobRecord, principal: Principal) -> bool:
        """Whether ``record`` is a job of the principal's tenant (FailedPrecondition: key retired)."""
        expected = self.tenant_key(principal, self.key_id(record))
        return hmac.compare_digest(record.tenant_key, expected)

    def request_digest(
        self, principal: Principal, spec: QuerySpec, key_id: str | None = None
    ) -> str:
        key = self._digest_key(self._ring.active_id if key_id is None else key_id)
        mac = hmac.new(key, digestmod=hashlib.sha256)
        for part in (principal.principal_id, principal.tenant_id, spec.sql, spec.params_ipc or ""):
            mac.update(part.encode())
            mac.update(b"\0")
        return mac.hexdigest()

    def seal_body(self, body: JobBody) -> str:
        """The sealed body (under the active key: :meth:`sealed_key_id` names it)."""
        return _b64(self._jobs.seal(JOB_PRINCIPAL, body.model_dump(mode="json")))

    def open_body(self, record: JobRecord) -> JobBody:
        self._digest_key(self.key_id(record))  # FailedPrecondition when the key was retired
        try:
            raw = self._jobs.open(base64.b64decode(record.sealed), JOB_PRINCIPAL)
            return JobBody.model_validate(raw)
        except (ValueError, ValidationError, Unauthenticated, PermissionDenied):
            # Sealed by another key ring or Lake version: the job cannot run here.
            raise InvalidArgument("the async job was sealed by an incompatible replica") from None

    def seal_handle(self, principal: Principal, job_id: str) -> bytes:
        return self._handles.seal(principal, {"k": "job", "j": job_id})

    def open_handle(self, handle: bytes, principal: Principal) -> str:
        """The job id of a handle, or Unauthenticated/PermissionDenied.

        FailedPrecondition for a well-formed handle sealed under a key the ring
        no longer holds: a durable handle outlives a rotation's retire step,
        and its holder must learn to submit again, not that its token is bad.
        """
        if len(handle) > 16 * 1024:
            raise Unauthenticated("invalid async query handle")
        key_id = ticket_key_id(handle)
        if key_id is not None and key_id not in self._keys:
            raise FailedPrecondition(
                "the async query handle was sealed under a ticket key this replica no longer "
                "holds; submit the query again"
            )
        body = self._handles.open(handle, principal)
        job_id = body.get("j")
        if body.get("k") != "job" or not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise Unauthenticated("invalid async query handle")
        return job_id
