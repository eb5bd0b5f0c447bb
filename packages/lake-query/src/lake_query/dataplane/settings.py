"""Where the native data plane listens and what endpoint locations advertise.

``LAKE_QUERY_DATA_ADDR`` follows the main listener's rules (host:port, the
listener security policy of :class:`lake_core.security.ServerSecurity`);
``LAKE_QUERY_DATA_ADVERTISE`` names the host:port clients dial. A wildcard
bind (``0.0.0.0``, ``[::]``) has no address a client could dial, so it needs
an explicit advertise setting. Parsed with the rest of Query's configuration,
before any listener binds.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from lake_core.config import QUERY_DATA_ADDR, QUERY_DATA_ADVERTISE
from lake_core.errors import ConfigError
from lake_core.security import ServerSecurity

__all__ = ["DataPlaneSettings"]

_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")


def _host_port(value: str, variable: str) -> tuple[str, int]:
    match = _HOST_PORT.fullmatch(value)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigError(
            f"{variable} must be host:port (for example 127.0.0.1:50053), got {value!r}"
        )
    return match.group(1), int(match.group(2))


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


@dataclass(frozen=True)
class DataPlaneSettings:
    """The data plane's bind address and advertised ``host:port`` (validated)."""

    addr: str
    advertise: str

    def uri(self, tls: bool) -> str:
        """The endpoint location clients are sent to."""
        return ("grpc+tls://" if tls else "grpc+tcp://") + self.advertise

    @property
    def bind_uri(self) -> str:
        return "grpc+tcp://" + self.addr

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    @classmethod
    def from_env(cls, env: Mapping[str, str], main_addr: str) -> DataPlaneSettings | None:
        """None when ``LAKE_QUERY_DATA_ADDR`` is unset; ConfigError naming a bad value."""
        addr = (env.get(QUERY_DATA_ADDR) or "").strip()
        advertise = (env.get(QUERY_DATA_ADVERTISE) or "").strip()
        if not addr:
            if advertise:
                raise ConfigError(f"{QUERY_DATA_ADVERTISE} is set but {QUERY_DATA_ADDR} is not")
            return None
        host, port = _host_port(addr, QUERY_DATA_ADDR)
        if addr == main_addr:
            raise ConfigError(f"{QUERY_DATA_ADDR} {addr} is the main listener's address (--addr)")
        if advertise:
            if _wildcard(_host_port(advertise, QUERY_DATA_ADVERTISE)[0]):
                raise ConfigError(
                    f"{QUERY_DATA_ADVERTISE} must name a dialable host, got {advertise!r}"
                )
        elif _wildcard(host):
            raise ConfigError(
                f"{QUERY_DATA_ADDR} {addr} binds every interface: set {QUERY_DATA_ADVERTISE} to "
                "the host:port clients dial"
            )
        else:
            advertise = f"{host}:{port}"
        # The same policy as the main listener: credentials off loopback, TLS or an explicit
        # opt-out (both listeners share the credentials and the certificate).
        ServerSecurity.load(addr, env, addr_flag=QUERY_DATA_ADDR)
        return cls(addr=addr, advertise=advertise)
