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
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lake_core.config import (
    QUERY_CATALOG_REFRESH_MS,
    QUERY_TICKET_AUDIENCE,
    QUERY_TICKET_KEYS_FILE,
    QUERY_TICKET_TTL_SECS,
    env_int,
    is_loopback_address,
)
from lake_core.errors import ConfigError
from lake_core.tickets import TicketKeyRing

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
_METADATA_SCHEMES = ("http://", "https://", "grpc://", "grpc+tls://")
_AUDIENCE = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")


def _check_listen_addr(addr: str) -> str:
    match = _HOST_PORT.fullmatch(addr)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(f"--addr must be host:port (for example {DEFAULT_ADDR}), got {addr!r}")
    return addr


def _check_metadata_addr(addr: str) -> str:
    rest = next((addr[len(s) :] for s in _METADATA_SCHEMES if addr.startswith(s)), None)
    if rest is None or _HOST_PORT.fullmatch(rest.rstrip("/")) is None:
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
    ) -> QueryConfig:
        """Parse flags plus ``LAKE_QUERY_*`` variables; raise ConfigError naming the bad one."""
        source = os.environ if env is None else env
        addr = _check_listen_addr(addr.strip())
        metadata_addr = _check_metadata_addr(metadata_addr.strip())
        loopback = is_loopback_address(addr)
        if not loopback:
            # Authentication and TLS configuration are not wired into Query yet;
            # refuse rather than serve anonymous plaintext off loopback.
            raise ConfigError(
                f"--addr {addr} is not a loopback address: non-loopback Query listeners need "
                "authentication and TLS, which this build does not configure yet"
            )
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
        return cls(
            addr=addr,
            metadata_addr=metadata_addr,
            ticket_ring=ring,
            ticket_ttl_secs=ttl,
            catalog_refresh_ms=refresh,
            audience=audience,
        )
