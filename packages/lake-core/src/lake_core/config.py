"""Every ``LAKE_*`` environment variable Lake reads, with its parser.

Processes parse their whole configuration before opening storage or binding
a listener, so a bad value fails startup without side effects.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

from lake_core.errors import ConfigError

__all__ = [
    "APPEND_OPERATION_RETENTION_SECS",
    "LANCE_RETAIN_VERSIONS",
    "QUERY_CATALOG_REFRESH_MS",
    "QUERY_TICKET_AUDIENCE",
    "QUERY_TICKET_KEYS_FILE",
    "QUERY_TICKET_TTL_SECS",
    "SHUTDOWN_GRACE_MS",
    "env_int",
    "is_loopback_address",
]

#: Drain window for SIGINT/SIGTERM, in milliseconds (positive; default 30 s).
SHUTDOWN_GRACE_MS = "LAKE_SHUTDOWN_GRACE_MS"
#: Lance versions kept per table besides tagged ones (1..=10000, default 10).
LANCE_RETAIN_VERSIONS = "LAKE_LANCE_RETAIN_VERSIONS"
#: How long Metasrv remembers an append operation id (default 7 days).
APPEND_OPERATION_RETENTION_SECS = "LAKE_APPEND_OPERATION_RETENTION_SECS"
#: Key ring shared by Query replicas to seal tickets (0600 JSON file).
QUERY_TICKET_KEYS_FILE = "LAKE_QUERY_TICKET_KEYS_FILE"
#: Ticket lifetime in seconds (1..=3600, default 300).
QUERY_TICKET_TTL_SECS = "LAKE_QUERY_TICKET_TTL_SECS"
#: The audience tickets are bound to: one value per Query fleet.
QUERY_TICKET_AUDIENCE = "LAKE_QUERY_TICKET_AUDIENCE"
#: How often a Query replica asks Metasrv whether its catalog changed (ms).
QUERY_CATALOG_REFRESH_MS = "LAKE_QUERY_CATALOG_REFRESH_MS"


def env_int(
    name: str,
    default: int,
    low: int,
    high: int,
    env: Mapping[str, str] | None = None,
) -> int:
    """Parse an integer variable within ``low..=high``, or raise ConfigError naming it."""
    source = os.environ if env is None else env
    raw = source.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise ConfigError(f"{name} must be an integer in {low}..={high}, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in {low}..={high}, got {value}")
    return value


def is_loopback_address(addr: str) -> bool:
    """True when a ``host:port`` listen address binds only the loopback interface."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
