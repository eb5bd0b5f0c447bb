"""Metasrv configuration, parsed completely before any storage opens.

A bad value raises :class:`~lake_core.errors.ConfigError` naming the flag or
variable, so ``lake meta`` fails at startup without creating a data directory,
a registry file or a listener.

Security (see ``docs/security.md``): ``LAKE_AUTH_PRINCIPALS_FILE`` or
``LAKE_AUTH_TOKEN_FILE``, ``LAKE_TLS_CERT_FILE``/``LAKE_TLS_KEY_FILE`` and
``LAKE_ALLOW_INSECURE`` under :class:`lake_core.security.ServerSecurity`'s
policy (a non-loopback listener needs credentials and TLS); the follower
client settings ``LAKE_PEER_AUTH_TOKEN_FILE``, ``LAKE_PEER_CA_FILE`` and
``LAKE_PEER_SERVER_NAME``.

Cloud mode (see ``docs/cloud.md``): ``LAKE_CLOUD_MODE=true`` with the
settings of :class:`lake_core.cloud.CloudSettings`, plus
``LAKE_PEER_ADVERTISE_URL``, the URL other Metasrv nodes forward writes to
(default: ``http(s)://`` + ``--addr``; required when ``--addr`` is a wildcard).

Fault injection (tests only): ``LAKE_FAULTS`` (:mod:`lake_core.faults`),
parsed here with everything else, so a bad point name fails startup.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lake_core.auth import PEER_AUTH_TOKEN_FILE, Authenticator, Secret
from lake_core.cloud import CloudSettings
from lake_core.config import (
    COMMIT_GROUP_MAX_APPENDS,
    COMMIT_GROUP_MAX_ROWS,
    DEFAULT_OPERATION_RETENTION_SECS,
    INGEST_MAX_BYTES,
    INGEST_MAX_ROWS,
    LANCE_RETAIN_MIN_AGE_SECS,
    LANCE_RETAIN_VERSIONS,
    PEER_ADVERTISE_URL,
    env_int,
    operation_retention_secs,
)
from lake_core.errors import ConfigError
from lake_core.faults import LEASE_TTL_MS, Faults
from lake_core.faults import configure as configure_faults
from lake_core.flight.server import shutdown_grace_ms as parse_grace_ms
from lake_core.security import (
    ALLOW_INSECURE,
    ServerSecurity,
    check_internal_client,
    env_bool,
    optional_token,
)
from lake_core.tls import PEER_CA_FILE, PEER_SERVER_NAME, ClientTLS, load_client_tls
from lake_objects.settings import StageSettings

__all__ = [
    "DEFAULT_ADDR",
    "DEFAULT_DATA_DIR",
    "MetaConfig",
]

DEFAULT_ADDR = "127.0.0.1:50052"
DEFAULT_DATA_DIR = "./lake-data"
DEFAULT_RETAIN_VERSIONS = 10
MAX_RETAIN_VERSIONS = 10_000
#: Above the default ticket lifetime (300 s) plus the catalog refresh, with room to spare.
DEFAULT_RETAIN_MIN_AGE_SECS = 900
#: 30 days; 0 keeps only the count window (tests).
MAX_RETAIN_MIN_AGE_SECS = 30 * 24 * 3600

DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_GROUP_MAX_APPENDS = 64
MAX_GROUP_MAX_APPENDS = 1024
DEFAULT_GROUP_MAX_ROWS = 100_000
#: Lance's default rows per data file: a group of small appends stays one file.
MAX_GROUP_MAX_ROWS = 1_048_576
#: Bulk ingest bounds (LAKE_INGEST_MAX_ROWS, LAKE_INGEST_MAX_BYTES; lake_metasrv.ingest).
DEFAULT_INGEST_MAX_ROWS = 100_000_000
MAX_INGEST_MAX_ROWS = 10_000_000_000
DEFAULT_INGEST_MAX_BYTES = 64 * 1024**3
MIN_INGEST_MAX_BYTES = 1024 * 1024
MAX_INGEST_MAX_BYTES = 16 * 1024**4


@dataclass(frozen=True)
class MetaConfig:
    """Everything ``lake meta`` and ``lake table`` need, validated."""

    data_dir: Path
    addr: str = DEFAULT_ADDR
    retain_versions: int = DEFAULT_RETAIN_VERSIONS
    #: A replaced version stays at least this long (outside both windows: reclaimed).
    retain_min_age_secs: int = DEFAULT_RETAIN_MIN_AGE_SECS
    operation_retention_secs: int = DEFAULT_OPERATION_RETENTION_SECS
    shutdown_grace_ms: int = 30_000
    #: Bounds of one commit group (appends to one table committed as one version).
    group_max_appends: int = DEFAULT_GROUP_MAX_APPENDS
    group_max_rows: int = DEFAULT_GROUP_MAX_ROWS
    #: Armed fault points (tests only; nothing armed by default).
    faults: Faults = field(default_factory=Faults)
    #: The managed object stage whose tenant prefixes FILE cells must stay in
    #: (None: the local stage ``<data_dir>/objects``); see lake_objects.settings.
    stage: StageSettings | None = None
    #: Listener policy: authenticator (honouring delegation) and TLS.
    security: ServerSecurity = field(
        default_factory=lambda: ServerSecurity(Authenticator(None, delegation=True))
    )
    #: Follower-to-leader client settings (parsed and validated; used by forwarding).
    peer_token: Secret | None = None
    peer_tls: ClientTLS = field(default_factory=ClientTLS)
    #: Cloud mode (S3 tables, DynamoDB registry, leader lease); None: local data directory.
    cloud: CloudSettings | None = None
    #: Where followers forward writes when this node leads (None: derived from ``addr``).
    advertise_url: str | None = None
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    ingest_max_rows: int = DEFAULT_INGEST_MAX_ROWS
    ingest_max_bytes: int = DEFAULT_INGEST_MAX_BYTES

    @classmethod
    def load(
        cls,
        *,
        data_dir: str | os.PathLike[str] = DEFAULT_DATA_DIR,
        addr: str = DEFAULT_ADDR,
        env: Mapping[str, str] | None = None,
    ) -> MetaConfig:
        """Parse flags and ``LAKE_*`` variables; touch nothing on disk."""
        source: Mapping[str, str] = os.environ if env is None else env
        addr = _listen_addr(addr)
        # The process's own environment: also this process's faults (read once, here).
        faults = configure_faults() if env is None else Faults.from_env(source)
        return cls(
            data_dir=_data_dir(data_dir),
            addr=addr,
            retain_versions=env_int(
                LANCE_RETAIN_VERSIONS, DEFAULT_RETAIN_VERSIONS, 1, MAX_RETAIN_VERSIONS, source
            ),
            retain_min_age_secs=env_int(
                LANCE_RETAIN_MIN_AGE_SECS,
                DEFAULT_RETAIN_MIN_AGE_SECS,
                0,
                MAX_RETAIN_MIN_AGE_SECS,
                source,
            ),
            operation_retention_secs=operation_retention_secs(source),
            shutdown_grace_ms=_grace_ms(source),
            group_max_appends=env_int(
                COMMIT_GROUP_MAX_APPENDS,
                DEFAULT_GROUP_MAX_APPENDS,
                1,
                MAX_GROUP_MAX_APPENDS,
                source,
            ),
            group_max_rows=env_int(
                COMMIT_GROUP_MAX_ROWS, DEFAULT_GROUP_MAX_ROWS, 1, MAX_GROUP_MAX_ROWS, source
            ),
            ingest_max_rows=env_int(
                INGEST_MAX_ROWS, DEFAULT_INGEST_MAX_ROWS, 1, MAX_INGEST_MAX_ROWS, source
            ),
            ingest_max_bytes=env_int(
                INGEST_MAX_BYTES,
                DEFAULT_INGEST_MAX_BYTES,
                MIN_INGEST_MAX_BYTES,
                MAX_INGEST_MAX_BYTES,
                source,
            ),
            faults=faults,
            stage=StageSettings.from_env(
                source, default_local_root=_data_dir(data_dir) / "objects"
            ),
            security=ServerSecurity.load(addr, source, delegation=True),
            peer_token=optional_token(source, PEER_AUTH_TOKEN_FILE),
            peer_tls=load_client_tls(source, PEER_CA_FILE, PEER_SERVER_NAME),
            **_cloud(addr, source, faults),
        )


def _data_dir(value: str | os.PathLike[str]) -> Path:
    text = os.fspath(value)
    if not text.strip() or "\x00" in text:
        raise ConfigError(f"--data-dir must be a directory path, got {text[:80]!r}")
    path = Path(text).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--data-dir {str(path)[:200]!r} exists and is not a directory")
    return path


def _listen_addr(addr: str) -> str:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--addr must be host:port, got {addr[:80]!r}")
    return addr


def _grace_ms(env: Mapping[str, str]) -> int:
    # The shared server owns the parsing rule; we only turn it into a ConfigError.
    try:
        return parse_grace_ms(env)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _cloud(addr: str, env: Mapping[str, str], faults: Faults) -> dict[str, object]:
    """The cloud-mode fields of MetaConfig (empty in local mode)."""
    cloud = CloudSettings.from_env(env)
    if cloud is None:
        return {}
    host = addr.rpartition(":")[0].strip("[]")
    advertise = (env.get(PEER_ADVERTISE_URL) or "").strip().rstrip("/") or None
    if advertise is None and host in ("0.0.0.0", "::", ""):
        raise ConfigError(
            f"--addr {addr} listens on every interface: set {PEER_ADVERTISE_URL} to the URL "
            "other Metasrv nodes reach this one at (for example https://lake-meta-0.lake-meta:50052)"
        )
    if advertise is not None:
        if not advertise.startswith(("http://", "https://")) or " " in advertise:
            raise ConfigError(f"{PEER_ADVERTISE_URL} must be an http(s):// URL, got {advertise!r}")
        tls = load_client_tls(env, PEER_CA_FILE, PEER_SERVER_NAME)
        check_internal_client(
            advertise,
            tls,
            allow_insecure=env_bool(env, ALLOW_INSECURE),
            url_flag=PEER_ADVERTISE_URL,
            ca_variable=PEER_CA_FILE,
            name_variable=PEER_SERVER_NAME,
        )
    ttl_ms = faults.setting(LEASE_TTL_MS)
    return {
        "cloud": cloud,
        "advertise_url": advertise,
        "lease_ttl_s": DEFAULT_LEASE_TTL_S if ttl_ms is None else ttl_ms / 1000,
    }
