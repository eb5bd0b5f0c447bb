"""``lake.status``: what one Metasrv node or Query replica says about itself.

An admin-only DoAction on both services. A Metasrv node reports its role
(leader or follower), the lease epoch it knows, how long that lease lasts,
its advertised URL, the leader's URL and its version; a Query replica its
admission figures. Nothing in it is a secret, a tenant or a workload name.
"""

from __future__ import annotations

from importlib import metadata as distributions
from typing import Literal

from lake_core.protocol import WireModel

__all__ = [
    "STATUS",
    "AdmissionStatus",
    "MemoryStatus",
    "MetasrvStatus",
    "QueryStatus",
    "StatusRequest",
    "lake_version",
]

STATUS = "lake.status"


def lake_version() -> str:
    try:
        return distributions.version("lake-core")
    except distributions.PackageNotFoundError:
        return "unknown"


class StatusRequest(WireModel):
    pass


class MetasrvStatus(WireModel):
    service: Literal["metasrv"] = "metasrv"
    node: str
    role: Literal["leader", "follower"]
    mode: Literal["local", "cloud"]
    epoch: int
    lease_expires_in_ms: int
    advertised_url: str
    leader_url: str
    version: str


class AdmissionStatus(WireModel):
    running: int
    queued: int
    tracked_tenants: int
    max_concurrent: int
    per_tenant: int
    refused_total: int


class MemoryStatus(WireModel):
    """The replica's query memory pool (``LAKE_QUERY_MEMORY_LIMIT_BYTES``)."""

    reserved_bytes: int
    limit_bytes: int


class QueryStatus(WireModel):
    service: Literal["query"] = "query"
    admission: AdmissionStatus
    catalog_generation: str | None
    version: str
    #: Whether the replica serves statements (gRPC health SERVING), and if not, why.
    serving: bool = True
    not_serving: tuple[str, ...] = ()
    #: Tables in the replica's catalog view, and how old that view is.
    catalog_tables: int | None = None
    catalog_age_ms: int | None = None
    memory: MemoryStatus | None = None
