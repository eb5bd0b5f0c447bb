"""Refusing a listen address that another process is already serving.

gRPC sets ``SO_REUSEPORT`` on its listeners by default, so a second server on
a busy port binds too and the kernel splits new connections between the two
processes at random. :data:`NO_PORT_REUSE` turns that off for Lake's servers;
:func:`ensure_address_free` additionally probes every address the host name
resolves to, because gRPC treats a host name whose addresses bind only in part
(``localhost`` -> ``::1`` free, ``127.0.0.1`` busy) as success and just logs a
warning.
"""

from __future__ import annotations

import errno
import socket

from lake_core.errors import ConfigError

__all__ = ["NO_PORT_REUSE", "address_in_use", "ensure_address_free"]

#: The gRPC server option that stops a second process binding the same port.
NO_PORT_REUSE = ("grpc.so_reuseport", 0)


def address_in_use(addr: str) -> ConfigError:
    """The startup error for a listen address another process serves."""
    return ConfigError(f"cannot listen on {addr}: the address is already in use by another process")


def _split(addr: str) -> tuple[str, int] | None:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "0.0.0.0", int(port)


def ensure_address_free(addr: str) -> None:
    """Raise ConfigError naming ``addr`` if any address ``addr`` resolves to is bound.

    Port 0 (any free port) is never busy. Addresses this host cannot bind for
    other reasons (say, IPv6 disabled) are left to gRPC to report.
    """
    parsed = _split(addr)
    if parsed is None or parsed[1] == 0:
        return
    host, port = parsed
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return  # gRPC reports the unresolvable name
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            # As gRPC does: SO_REUSEADDR lets TIME_WAIT leftovers through, not a listener.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise address_in_use(addr) from None
