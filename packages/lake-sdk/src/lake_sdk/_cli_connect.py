"""How ``lake sql``, ``lake files`` and ``lake table load`` reach Query: fast when nothing is there.

The SDK's ``Client`` waits up to its ``connect_timeout`` for Query to answer,
connection refused included: a long-running program that starts beside its
Query must not fail on the race. A person at a terminal who mistyped
``--addr``, or forgot to start Query, should not wait half a minute to learn
it. So without ``--connect-timeout`` a command first checks that something
accepts a TCP connection at the address, for at most
:data:`LISTEN_WAIT_S`, and fails at once (exit 75, naming the address) if
nothing does; once something listens, it waits up to
:data:`DEFAULT_CONNECT_TIMEOUT_S` for Query to serve (a replica still loading
its catalog). ``--connect-timeout SECONDS`` is the user's own bound on the
whole wait, for a Query still starting (``lake query &`` a moment ago).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from lake_core.endpoints import parse_endpoint
from lake_core.errors import Unavailable
from lake_sdk._sync import Client

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "LISTEN_WAIT_S",
    "connect_timeout_option",
    "open_client",
    "wait_listening",
]

#: How long a command waits for a Query that listens to serve, without ``--connect-timeout``.
DEFAULT_CONNECT_TIMEOUT_S = 30.0
#: How long a command waits for anything to listen at ``--addr``, without ``--connect-timeout``.
LISTEN_WAIT_S = 2.0
#: The largest ``--connect-timeout`` (the SDK's own bound on ``connect_timeout``).
MAX_CONNECT_TIMEOUT_S = 3600.0
#: The least time Query gets to serve once it listens, however little of the timeout is left.
_LEAST_SERVE_WAIT_S = 1.0
#: How often the port is tried while nothing listens.
_POLL_S = 0.05
_WAIT_HINT = " To wait for a Query that is still starting, give --connect-timeout SECONDS"
#: Environment variables that route gRPC through a proxy (then a direct TCP check proves nothing).
_PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")

F = TypeVar("F", bound=Callable[..., Any])


def _seconds(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    """``--connect-timeout``: a finite number of seconds in (0, 3600], else a usage error."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_CONNECT_TIMEOUT_S):
        raise click.BadParameter(
            f"must be a number of seconds in (0, {MAX_CONNECT_TIMEOUT_S:g}], got {value!r}"
        )
    return seconds


def connect_timeout_option(command: F) -> F:
    """The ``--connect-timeout SECONDS`` option of a command that talks to Query."""
    return click.option(
        "--connect-timeout",
        "connect_timeout",
        metavar="SECONDS",
        default=None,
        callback=_seconds,
        help=(
            "Wait up to SECONDS for Query to serve, also while nothing listens at --addr "
            "yet (a Query still starting). Default: fail within "
            f"{LISTEN_WAIT_S:g} s if nothing listens there, wait up to "
            f"{DEFAULT_CONNECT_TIMEOUT_S:g} s for a Query that does."
        ),
    )(command)


def open_client(url: str, connect_timeout: float | None) -> Client:
    """A Client of ``url`` for a command, once something listens there; enter it to wait for Query.

    Without ``connect_timeout``: something must listen within
    :data:`LISTEN_WAIT_S`, and Query then has :data:`DEFAULT_CONNECT_TIMEOUT_S`
    to serve. With it, both fit in ``connect_timeout``. Polling the port here
    rather than through the client keeps gRPC's reconnect backoff (seconds,
    growing) from delaying the first call to a Query that just bound.
    """
    if connect_timeout is None:
        wait_listening(url, LISTEN_WAIT_S, hint=_WAIT_HINT)
        return Client(url, connect_timeout=DEFAULT_CONNECT_TIMEOUT_S)
    deadline = time.monotonic() + connect_timeout
    wait_listening(url, connect_timeout)
    return Client(url, connect_timeout=max(deadline - time.monotonic(), _LEAST_SERVE_WAIT_S))


def wait_listening(url: str, seconds: float, *, hint: str = "") -> None:
    """Return once a TCP connection to ``url``'s address succeeds; Unavailable after ``seconds``.

    Checks nothing for an address it cannot split or that gRPC would reach
    through a proxy: the client's own wait (and error) then applies.
    """
    address = _host_port(url)
    if address is None or _proxied():
        return
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        try:
            socket.create_connection(address, timeout=max(left, _POLL_S)).close()
            return
        except OSError as exc:  # refused, unresolvable, unreachable, no answer
            reason = exc.strerror or str(exc) or type(exc).__name__
        if time.monotonic() + _POLL_S >= deadline:
            raise Unavailable(
                f"nothing is listening at {url} ({reason}; waited {seconds:g} s): "
                f"is Lake Query running there?{hint}"
            )
        time.sleep(_POLL_S)


def _host_port(url: str) -> tuple[str, int] | None:
    """``url``'s host and port (brackets of an IPv6 literal removed), or None."""
    endpoint = parse_endpoint(url)
    if endpoint is None:
        return None
    host, _, port = endpoint.target.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _proxied() -> bool:
    return any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARIABLES)
