"""What Query tells an SDK about its managed stage, and the capability bodies.

The descriptor is versioned and credential-free: a stage kind, the tenant's
child stage URI (``file:///root/tenants/<t>`` or ``s3://bucket/prefix/tenants/<t>``)
and, for S3, region and endpoint hints. Credentials always come from the SDK
process's own environment.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from lake_core.models import DataLocation
from lake_core.protocol import WireModel
from lake_objects.scope import TENANTS_DIR, TenantScope, validate_tenant_id

__all__ = [
    "MANAGED_STAGE",
    "MAX_CAPABILITY_TTL_SECS",
    "READ_CAPABILITY",
    "ReadCapabilityRequest",
    "ReadCapabilityResult",
    "StageDescriptor",
    "StageRequest",
]

#: DoAction: the caller's stage descriptor (body: StageRequest).
MANAGED_STAGE = "lake.managed_stage"
#: DoAction: a bounded read capability for one DataLocation (body: ReadCapabilityRequest).
READ_CAPABILITY = "lake.read_capability"
MIN_CAPABILITY_TTL_SECS = 1
MAX_CAPABILITY_TTL_SECS = 3600

_ENDPOINT = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?/?"
)
_REGION = re.compile(r"[a-z0-9-]{1,64}")


class StageDescriptor(WireModel):
    """One tenant's child stage, as the SDK needs it to upload and read directly."""

    kind: Literal["local", "s3"]
    tenant_id: str
    uri: str = Field(max_length=2048)
    region: str | None = None
    endpoint_url: str | None = None

    @field_validator("tenant_id")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return validate_tenant_id(value)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION.fullmatch(value):
            raise ValueError("region must be lowercase letters, digits and '-'")
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        # Only scheme, host and port: no userinfo, path or query can smuggle a secret.
        if value is not None and not _ENDPOINT.fullmatch(value):
            raise ValueError("endpoint_url must be http(s)://host[:port]")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _shape(self) -> StageDescriptor:
        scheme = "file:///" if self.kind == "local" else "s3://"
        if not self.uri.startswith(scheme):
            raise ValueError(f"a {self.kind} stage uri starts with {scheme}")
        if not self.uri.endswith(f"/{TENANTS_DIR}/{self.tenant_id}"):
            raise ValueError("the stage uri must end with tenants/<tenant_id>")
        body = self.uri[len(scheme) :]
        if "//" in body or any(s in (".", "..") for s in body.split("/")):
            raise ValueError("the stage uri has empty, '.' or '..' segments")
        TenantScope(self.uri).check(self.uri + "/x")  # every character is safe
        return self

    @property
    def scope(self) -> TenantScope:
        return TenantScope(self.uri)

    @property
    def bucket(self) -> str:
        """The S3 bucket (S3 stages only)."""
        return self.uri[len("s3://") :].split("/", 1)[0]

    @property
    def key_prefix(self) -> str:
        """The S3 key prefix of the tenant's child stage, without a trailing slash."""
        return self.uri[len("s3://") :].split("/", 1)[1]

    @property
    def local_root(self) -> str:
        """The tenant's child directory (local stages only)."""
        return self.uri[len("file://") :]


class StageRequest(WireModel):
    """Body of ``lake.managed_stage``: the caller's own tenant is implied."""


class ReadCapabilityRequest(WireModel):
    location: DataLocation
    ttl_secs: int = Field(ge=MIN_CAPABILITY_TTL_SECS, le=MAX_CAPABILITY_TTL_SECS)
    start: int | None = Field(default=None, ge=0)
    end: int | None = Field(default=None, ge=0)


class ReadCapabilityResult(WireModel):
    """A presigned GET: the URL and headers are bearer values; never log them."""

    url: str = Field(max_length=16384)
    headers: dict[str, str] = Field(default_factory=dict)
    expires_at_ms: int

    def __repr__(self) -> str:
        return f"ReadCapabilityResult(url=<redacted>, expires_at_ms={self.expires_at_ms})"

    __str__ = __repr__
