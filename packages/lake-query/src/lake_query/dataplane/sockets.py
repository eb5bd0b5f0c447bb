"""Ending one client's TCP connection from inside the data plane's own process.

A DoGet whose client stops reading blocks in pyarrow's C++ write once the
HTTP/2 window and socket buffers are full. Python cannot interrupt that write,
the generator is never resumed, and ``FlightServerBase.shutdown()`` waits for
it forever. Shutting the connection's socket down makes the write fail, so
C++ ends the stream and finalizes the generator (its ``finally`` runs).

pyarrow gives no handle on a call's socket, only ``ServerCallContext.peer()``
(``ipv4:127.0.0.1:54321``, ``ipv6:%5B::1%5D:54321``). On Linux,
:func:`drop_connection` finds the socket through ``/proc``: the kernel's
table of TCP connections (``/proc/self/net/tcp`` and ``tcp6``) gives the
inode of the connection whose local port and remote address match, and
``/proc/self/fd`` gives this process's descriptor for that inode. The
descriptor is duplicated, checked to still be that inode (it may have been
closed and reused meanwhile), shut down, and only the duplicate is closed:
gRPC keeps owning the original. Nothing runs until it is called.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import struct
import sys
from collections.abc import Iterator

__all__ = ["drop_connection", "parse_peer", "supported"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_NET = "/proc/self/net"
_FDS = "/proc/self/fd"
# gRPC's peer strings. pyarrow 26's gRPC URI-escapes the IPv6 brackets
# (ipv6:%5B::1%5D:54321), other gRPC builds do not; a zone comes as %25eth0.
_IPV4_PEER = re.compile(r"ipv4:(?P<host>[0-9.]{7,15}):(?P<port>[0-9]{1,5})")
_IPV6_HOST = r"(?P<host>[0-9A-Fa-f:.]{2,45})(?:%25[A-Za-z0-9_.-]{1,64})?"
_IPV6_PEERS = (
    re.compile(rf"ipv6:\[{_IPV6_HOST}\]:(?P<port>[0-9]{{1,5}})"),
    re.compile(rf"ipv6:%5[Bb]{_IPV6_HOST}%5[Dd]:(?P<port>[0-9]{{1,5}})"),
)
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's state column


def supported() -> bool:
    """Whether :func:`drop_connection` can work here (Linux with ``/proc`` mounted)."""
    return (
        sys.platform.startswith("linux") and os.path.isdir(_FDS) and os.path.exists(f"{_NET}/tcp")
    )


def parse_peer(peer: str) -> tuple[Address, int]:
    """The address and port in a gRPC peer string; ValueError for anything else."""
    if not isinstance(peer, str):
        raise ValueError(f"a peer must be a string, got {type(peer).__name__}")
    match = _IPV4_PEER.fullmatch(peer)
    for pattern in _IPV6_PEERS:
        match = match or pattern.fullmatch(peer)
    if match is None:
        raise ValueError(f"not a gRPC TCP peer (ipv4:A.B.C.D:PORT or ipv6:[ADDR]:PORT): {peer!r}")
    try:
        address = ipaddress.ip_address(match["host"])
    except ValueError:
        raise ValueError(f"bad address in peer {peer!r}") from None
    if address.version != (4 if peer.startswith("ipv4:") else 6):
        raise ValueError(f"address family does not match the prefix in peer {peer!r}")
    port = _port(match["port"], f"peer {peer!r}")
    return _unmapped(address), port


def drop_connection(local_port: int, peer: str) -> bool:
    """Shut down this process's TCP connection on ``local_port`` from ``peer``.

    ``peer`` is what pyarrow's ``ServerCallContext.peer()`` returns. Returns
    whether such a connection was found (and shut down); False also where
    :func:`supported` is False. A malformed ``peer`` or port is a ValueError.
    """
    if isinstance(local_port, bool) or not isinstance(local_port, int):
        raise ValueError(f"local_port must be an int, got {type(local_port).__name__}")
    _port(str(local_port), "local_port")
    address, port = parse_peer(peer)
    if not supported():
        return False
    inodes = set(_connection_inodes(local_port, address, port))
    if not inodes:
        return False
    dropped = False
    for fd, inode in _socket_fds(inodes):
        dropped |= _shutdown(fd, inode)
    return dropped


def _port(text: str, what: str) -> int:
    port = int(text)
    if not 0 < port < 65536 or text != str(port):
        raise ValueError(f"{what}: port must be 1-65535 without leading zeros, got {text!r}")
    return port


def _unmapped(address: Address) -> Address:
    # A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d; gRPC reports them as ipv4.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _connection_inodes(local_port: int, address: Address, port: int) -> Iterator[int]:
    """Inodes of connections in this network namespace with that local port and remote end."""
    tables = ("tcp", "tcp6") if address.version == 4 else ("tcp6",)
    for table in tables:
        try:
            with open(f"{_NET}/{table}", encoding="ascii") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] == _LISTEN:
                        continue
                    local, remote, inode = fields[1], fields[2], int(fields[9])
                    if inode == 0:  # TIME_WAIT and the like: no socket left to shut down
                        continue
                    if _endpoint_port(local) != local_port or _endpoint_port(remote) != port:
                        continue
                    if _endpoint_address(remote) == address:
                        yield inode
        except FileNotFoundError:  # no IPv6 in this kernel
            continue


def _endpoint_port(field: str) -> int:
    return int(field.rpartition(":")[2], 16)


def _endpoint_address(field: str) -> Address:
    # The kernel prints the address as 32-bit words in host byte order.
    hex_address = field.rpartition(":")[0]
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    return _unmapped(ipaddress.ip_address(packed))


def _socket_fds(inodes: set[int]) -> Iterator[tuple[int, int]]:
    """This process's descriptors (fd, inode) for the given socket inodes."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    with os.scandir(_FDS) as entries:
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError:  # closed since the listing
                continue
            inode = wanted.get(target)
            if inode is not None:
                yield int(entry.name), inode


def _shutdown(fd: int, inode: int) -> bool:
    try:
        dup = os.dup(fd)
    except OSError:
        return False  # closed since it was found
    try:
        if os.fstat(dup).st_ino != inode:
            return False  # the number was reused for another file meanwhile
        with socket.socket(fileno=dup) as sock:
            dup = -1  # the socket object owns (and closes) the duplicate now
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError as error:
                if error.errno != errno.ENOTCONN:  # already down: still the one we wanted
                    raise
        return True
    finally:
        if dup >= 0:
            os.close(dup)
