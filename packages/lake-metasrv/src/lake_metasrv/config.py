"""Metasrv configuration, parsed completely before any storage opens.

A bad value raises :class:`~lake_core.errors.ConfigError` naming the flag or
variable, so ``lake meta`` fails at startup without creating a data directory,
a registry file or a listener.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lake_core.config import (
    APPEND_OPERATION_RETENTION_SECS,
    LANCE_RETAIN_VERSIONS,
    env_int,
    is_loopback_address,
)
from lake_core.errors import ConfigError
from lake_core.flight.server import shutdown_grace_ms as parse_grace_ms

__all__ = [
    "CRASH_POINTS",
    "DEFAULT_ADDR",
    "DEFAULT_DATA_DIR",
    "TEST_CRASH_POINT",
    "TEST_HOOKS",
    "MetaConfig",
]

DEFAULT_ADDR = "127.0.0.1:50052"
DEFAULT_DATA_DIR = "./lake-data"
DEFAULT_RETAIN_VERSIONS = 10
MAX_RETAIN_VERSIONS = 10_000
DEFAULT_OPERATION_RETENTION_SECS = 7 * 24 * 3600
# Ten years: long enough for any deployment, short enough to stay a sane integer.
MAX_OPERATION_RETENTION_SECS = 10 * 365 * 24 * 3600

#: Set to ``1`` to enable fault-injection hooks (tests only).
TEST_HOOKS = "LAKE_TEST_HOOKS"
#: With hooks enabled, the commit step at which Metasrv calls ``os._exit(137)``.
TEST_CRASH_POINT = "LAKE_TEST_CRASH_POINT"
CRASH_POINTS = frozenset({"before_lance_commit", "after_lance_commit", "after_registry_commit"})


@dataclass(frozen=True)
class MetaConfig:
    """Everything ``lake meta`` and ``lake table`` need, validated."""

    data_dir: Path
    addr: str = DEFAULT_ADDR
    retain_versions: int = DEFAULT_RETAIN_VERSIONS
    operation_retention_secs: int = DEFAULT_OPERATION_RETENTION_SECS
    shutdown_grace_ms: int = 30_000
    crash_point: str | None = None

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
        return cls(
            data_dir=_data_dir(data_dir),
            addr=_listen_addr(addr),
            retain_versions=env_int(
                LANCE_RETAIN_VERSIONS, DEFAULT_RETAIN_VERSIONS, 1, MAX_RETAIN_VERSIONS, source
            ),
            operation_retention_secs=env_int(
                APPEND_OPERATION_RETENTION_SECS,
                DEFAULT_OPERATION_RETENTION_SECS,
                1,
                MAX_OPERATION_RETENTION_SECS,
                source,
            ),
            shutdown_grace_ms=_grace_ms(source),
            crash_point=_crash_point(source),
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
    if not is_loopback_address(addr):
        # Anonymous plaintext is only acceptable on loopback, and this build has
        # no authentication or TLS configuration for Metasrv yet.
        raise ConfigError(
            f"--addr {addr!r} is not a loopback address; a non-loopback Metasrv "
            "listener requires authentication and TLS, which are not configured"
        )
    return addr


def _grace_ms(env: Mapping[str, str]) -> int:
    # The shared server owns the parsing rule; we only turn it into a ConfigError.
    try:
        return parse_grace_ms(env)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _crash_point(env: Mapping[str, str]) -> str | None:
    if env.get(TEST_HOOKS, "").strip() != "1":
        return None
    point = env.get(TEST_CRASH_POINT, "").strip()
    if not point:
        return None
    if point not in CRASH_POINTS:
        known = ", ".join(sorted(CRASH_POINTS))
        raise ConfigError(f"{TEST_CRASH_POINT} must be one of {known}, got {point[:80]!r}")
    return point
