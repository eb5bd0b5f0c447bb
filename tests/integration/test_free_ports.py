"""Port pickers never hand out one port twice, even when the kernel repeats itself.

Nothing listens on a picked port until its server starts, so the kernel may
return the same ephemeral port to two binds in a row. These tests make it do
exactly that and check the second caller is given another port.
"""

from __future__ import annotations

import socket

import pytest

from lake_sdk import demo
from tools.lake_testing import servers

REPEATED, OTHER = 41_001, 41_002


def _kernel_repeats(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> list[int]:
    """Sockets whose bound port is read from ``ports``: what a repeating kernel would report."""
    script = iter(ports)
    reported: list[int] = []

    class RepeatingSocket(socket.socket):
        def getsockname(self) -> tuple[str, int]:
            port = next(script)
            reported.append(port)
            return ("127.0.0.1", port)

    monkeypatch.setattr(socket, "socket", RepeatingSocket)
    return reported


def test_free_port_skips_a_port_the_kernel_hands_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A private ledger, so ports handed out earlier in the session do not interfere.
    monkeypatch.setattr(servers, "_HANDED_OUT", set())
    reported = _kernel_repeats(monkeypatch, [REPEATED, REPEATED, OTHER])
    first = servers.free_port()
    second = servers.free_port()
    monkeypatch.undo()
    assert reported == [REPEATED, REPEATED, OTHER]  # the collision did happen
    assert (first, second) == (REPEATED, OTHER)


def test_lake_demo_gives_metasrv_and_query_different_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported = _kernel_repeats(monkeypatch, [REPEATED, REPEATED, OTHER])
    ports = demo._free_ports(2)
    monkeypatch.undo()
    assert reported == [REPEATED, REPEATED, OTHER]
    assert ports == [REPEATED, OTHER]
