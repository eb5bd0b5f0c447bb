"""Query's process configuration, parsed whole before anything binds.

Flags: ``--addr`` (listen address) and ``--metadata-addr`` (Metasrv URL).
Environment (constants in :mod:`lake_core.config`):

- ``LAKE_QUERY_TICKET_KEYS_FILE``: the key ring shared by every replica; when
  unset, an ephemeral process-local key is used, which is allowed only on a
  loopback listener (tickets then redeem only on the replica that issued them).
- ``LAKE_QUERY_TICKET_TTL_SECS``: ticket lifetime, 1..=3600, default 300.
- ``LAKE_QUERY_TICKET_AUDIENCE``: the audience tickets are bound to, default
  ``lake-query``; replicas of one fleet share it.
- ``LAKE_QUERY_CATALOG_REFRESH_MS``: catalog refresh interval, default 1000.
- Table storage (:class:`lake_core.cloud.DatasetStorage`): ``s3://`` tables open
  through ``LAKE_MANIFEST_DYNAMODB_TABLE`` (default ``lake_manifests``) with
  ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL_DYNAMODB`` and
  ``LAKE_STORAGE_TIMEOUT_MS``; Query never reads the registry table.
- The managed object stage (:mod:`lake_objects.settings`): ``LAKE_S3_BUCKET``
  with ``LAKE_MANAGED_OBJECT_PREFIX``, or ``LAKE_MANAGED_OBJECT_ROOT``, or
  ``--data-dir`` (``<data-dir>/objects``, Metasrv's default local stage).

Security (``docs/security.md``): the listener policy of
:class:`lake_core.security.ServerSecurity` (``LAKE_AUTH_PRINCIPALS_FILE`` or
``LAKE_AUTH_TOKEN_FILE``, ``LAKE_TLS_CERT_FILE``/``LAKE_TLS_KEY_FILE``,
``LAKE_ALLOW_INSECURE``); the Metasrv client's ``LAKE_METADATA_AUTH_TOKEN_FILE``,
``LAKE_METADATA_CA_FILE`` and ``LAKE_METADATA_SERVER_NAME``; admission limits
from :class:`lake_query.serving.admission.AdmissionLimits` (``LAKE_QUERY_STALL_TIMEOUT_MS``,
default 60 s, among them: see :mod:`lake_query.serving.stall`); statement bounds
(``LAKE_QUERY_MEMORY_LIMIT_BYTES``, ``LAKE_QUERY_MAX_EXPRESSION_TERMS``, ...)
from :class:`lake_query.planning.limits.QueryLimits`;
``LAKE_QUERY_VERIFY_ON_OPEN`` (true/false, default true: :mod:`lake_query.planning.verify`);
partitioned scans (``LAKE_QUERY_MAX_ENDPOINTS``, ``LAKE_QUERY_MIN_ENDPOINT_ROWS``) from
:class:`lake_query.planning.partitions.PartitionLimits`;
``LAKE_ICEBERG_*``: the Iceberg plug-in validates them (:mod:`lake_query.planning.external`).
``LAKE_ASYNC_QUERIES`` and the other ``LAKE_ASYNC_*`` (:mod:`lake_query.jobs.settings`).
``LAKE_QUERY_DATA_ADDR`` and ``LAKE_QUERY_DATA_ADVERTISE``: the native DoGet data plane
(:mod:`lake_query.dataplane.settings`), off when unset.
``LAKE_QUERY_SCAN_CACHE_BYTES``: repeated scans from memory (:mod:`lake_query.planning.scan_cache`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lake_core.auth import METADATA_AUTH_TOKEN_FILE, Authenticator, Secret
from lake_core.cloud import DatasetStorage
from lake_core.config import (
    QUERY_CATALOG_REFRESH_MS,
    QUERY_TICKET_AUDIENCE,
    QUERY_TICKET_KEYS_FILE,
    QUERY_TICKET_TTL_SECS,
    env_int,
    is_loopback_address,
)
from lake_core.endpoints import parse_endpoint
from lake_core.errors import ConfigError
from lake_core.security import ServerSecurity, check_internal_client, optional_token
from lake_core.tickets import TicketKeyRing
from lake_core.tls import METADATA_CA_FILE, METADATA_SERVER_NAME, ClientTLS, load_client_tls
from lake_objects.settings import StageSettings
from lake_query.dataplane.settings import DataPlaneSettings
from lake_query.jobs.settings import AsyncSettings
from lake_query.planning.external import ExternalCatalog, load_external_catalogs
from lake_query.planning.limits import QueryLimits
from lake_query.planning.partitions import PartitionLimits
from lake_query.planning.scan_cache import DEFAULT_SCAN_CACHE_BYTES, scan_cache_bytes
from lake_query.planning.verify import verify_on_open
from lake_query.serving.admission import AdmissionLimits
from lake_query.serving.planning_threads import PlanningLimits

__all__ = [
    "DEFAULT_ADDR",
    "DEFAULT_AUDIENCE",
    "DEFAULT_CATALOG_REFRESH_MS",
    "DEFAULT_METADATA_ADDR",
    "DEFAULT_TICKET_TTL_SECS",
    "QueryConfig",
]

DEFAULT_ADDR = "127.0.0.1:50051"
DEFAULT_METADATA_ADDR = "http://127.0.0.1:50052"
DEFAULT_AUDIENCE = "lake-query"
DEFAULT_TICKET_TTL_SECS = 300
DEFAULT_CATALOG_REFRESH_MS = 1000
MAX_CATALOG_REFRESH_MS = 3_600_000

_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
_AUDIENCE = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")


def _check_listen_addr(addr: str) -> str:
    match = _HOST_PORT.fullmatch(addr)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(f"--addr must be host:port (for example {DEFAULT_ADDR}), got {addr!r}")
    return addr


def _check_metadata_addr(addr: str) -> str:
    endpoint = parse_endpoint(addr)
    if endpoint is None or _HOST_PORT.fullmatch(endpoint.target) is None:
        raise ConfigError(
            f"--metadata-addr must be a URL such as {DEFAULT_METADATA_ADDR}, got {addr!r}"
        )
    return addr.rstrip("/")


@dataclass(frozen=True)
class QueryConfig:
    """Everything ``lake query`` needs, validated."""

    addr: str
    metadata_addr: str
    ticket_ring: TicketKeyRing
    ticket_ttl_secs: int = DEFAULT_TICKET_TTL_SECS
    catalog_refresh_ms: int = DEFAULT_CATALOG_REFRESH_MS
    audience: str = DEFAULT_AUDIENCE
    #: The managed object stage SDKs upload to (None: this replica serves no FILE uploads).
    stage: StageSettings | None = None
    #: Listener policy: authenticator and TLS.
    security: ServerSecurity = field(default_factory=lambda: ServerSecurity(Authenticator(None)))
    #: Query's own credential and TLS settings for Metasrv.
    metadata_token: Secret | None = None
    metadata_tls: ClientTLS = field(default_factory=ClientTLS)
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    #: How ``s3://`` tables are opened (manifest table, endpoints, timeouts).
    storage: DatasetStorage = field(default_factory=DatasetStorage)
    #: Per-statement bounds: expression size, plan depth, memory, function outputs.
    limits: QueryLimits = field(default_factory=QueryLimits)
    #: ``LAKE_QUERY_VERIFY_ON_OPEN``: check data files before serving rows (lake_query.planning.verify).
    verify_on_open: bool = True
    #: ``LAKE_QUERY_MAX_ENDPOINTS`` and ``LAKE_QUERY_MIN_ENDPOINT_ROWS`` (partitioned scans).
    partitions: PartitionLimits = field(default_factory=PartitionLimits)
    #: Planning's deadline and threads (lake_query.serving.planning_threads).
    planning: PlanningLimits = field(default_factory=PlanningLimits)
    #: Plug-in catalogs (``iceberg``: lake_query.planning.external), validated, not started.
    external: tuple[ExternalCatalog, ...] = ()
    #: ``LAKE_ASYNC_*``: durable async queries (None: PollFlightInfo answers at once).
    async_queries: AsyncSettings | None = None
    #: ``LAKE_QUERY_DATA_ADDR``: the native DoGet data plane (None: off).
    data_plane: DataPlaneSettings | None = None
    #: ``LAKE_QUERY_SCAN_CACHE_BYTES``: memory for repeated scans (0: no scan cache).
    scan_cache_bytes: int = DEFAULT_SCAN_CACHE_BYTES

    @property
    def loopback(self) -> bool:
        return is_loopback_address(self.addr)

    @property
    def catalog_refresh_s(self) -> float:
        return self.catalog_refresh_ms / 1000

    @classmethod
    def load(
        cls,
        addr: str = DEFAULT_ADDR,
        metadata_addr: str = DEFAULT_METADATA_ADDR,
        env: Mapping[str, str] | None = None,
        data_dir: str | os.PathLike[str] | None = None,
    ) -> QueryConfig:
        """Parse flags plus ``LAKE_QUERY_*`` variables; raise ConfigError naming the bad one."""
        source = os.environ if env is None else env
        addr = _check_listen_addr(addr.strip())
        metadata_addr = _check_metadata_addr(metadata_addr.strip())
        loopback = is_loopback_address(addr)
        security = ServerSecurity.load(addr, source)
        metadata_tls = load_client_tls(source, METADATA_CA_FILE, METADATA_SERVER_NAME)
        check_internal_client(
            metadata_addr,
            metadata_tls,
            allow_insecure=security.allow_insecure,
            url_flag="--metadata-addr",
            ca_variable=METADATA_CA_FILE,
            name_variable=METADATA_SERVER_NAME,
        )
        metadata_token = optional_token(source, METADATA_AUTH_TOKEN_FILE)
        admission = AdmissionLimits.from_env(source)
        ttl = env_int(QUERY_TICKET_TTL_SECS, DEFAULT_TICKET_TTL_SECS, 1, 3600, source)
        refresh = env_int(
            QUERY_CATALOG_REFRESH_MS, DEFAULT_CATALOG_REFRESH_MS, 1, MAX_CATALOG_REFRESH_MS, source
        )
        audience = (source.get(QUERY_TICKET_AUDIENCE) or DEFAULT_AUDIENCE).strip()
        if not _AUDIENCE.fullmatch(audience):
            raise ConfigError(
                f"{QUERY_TICKET_AUDIENCE} must be 1-128 characters of letters, digits and '_.:/-'"
            )
        keys_file = (source.get(QUERY_TICKET_KEYS_FILE) or "").strip()
        if keys_file:
            ring = TicketKeyRing.from_file(Path(keys_file), QUERY_TICKET_KEYS_FILE)
        elif loopback:
            ring = TicketKeyRing.ephemeral()
        else:
            raise ConfigError(
                f"{QUERY_TICKET_KEYS_FILE} is required for a non-loopback listener ({addr}): "
                "replicas must share one ticket key ring"
            )
        jobs = AsyncSettings.from_env(source, data_dir=data_dir)
        return cls(
            addr=addr,
            metadata_addr=metadata_addr,
            ticket_ring=ring,
            ticket_ttl_secs=ttl,
            catalog_refresh_ms=refresh,
            audience=audience,
            stage=StageSettings.from_env(
                source, default_local_root=Path(data_dir) / "objects" if data_dir else None
            ),
            security=security,
            metadata_token=metadata_token,
            metadata_tls=metadata_tls,
            admission=admission,
            storage=DatasetStorage.from_env(source),
            # A query waiting for its memory share waits as long as for admission, and
            # every query admission lets in (and every async job) finds a pool.
            limits=dataclasses.replace(
                QueryLimits.from_env(source),
                memory_wait_ms=admission.queue_timeout_ms,
                memory_slots=admission.max_concurrent + (jobs.worker_concurrency if jobs else 0),
                memory_slots_per_tenant=admission.per_tenant
                + (jobs.worker_concurrency_per_tenant if jobs else 0),
            ),
            verify_on_open=verify_on_open(source),
            partitions=PartitionLimits.from_env(source),
            planning=PlanningLimits.from_env(source),
            external=load_external_catalogs(source),
            async_queries=jobs,
            data_plane=DataPlaneSettings.from_env(source, addr),
            scan_cache_bytes=scan_cache_bytes(source),
        )
