"""The exit status of every ``lake`` command, as docs/cli.md ("Exit status") states it.

2 when the command is refused (click's usage errors, Lake errors rerunning
will not fix), 75 for a retryable fault (a server or storage unavailable), so
a script can tell its own mistake from an outage. A fault used to exit 2, as a
typo does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import pytest

from lake_core import admin_cli
from lake_core.cli import lake, main
from tools.lake_testing.servers import free_port

#: The documented statuses (docs/cli.md), spelled out: the test pins the numbers.
EXIT_REFUSED = 2
EXIT_RETRYABLE = 75
COMMANDS = sorted(lake.list_commands(click.Context(lake)))


def _status(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """What ``lake ARGS`` exits with, run as the ``lake`` script runs it."""
    monkeypatch.setattr(sys, "argv", ["lake", *args])
    try:
        main()
    except SystemExit as exited:
        return int(exited.code or 0)
    return 0


@pytest.mark.parametrize("command", COMMANDS)
def test_a_usage_error_exits_2_in_every_command(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    assert _status(monkeypatch, command, "--no-such-option") == EXIT_REFUSED


def test_a_lake_refusal_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "lake-data")]
    assert _status(monkeypatch, "table", "create", "robots.t", "--column", "a:string", *data) == 0
    assert _status(monkeypatch, "table", "describe", "robots.nope", *data) == EXIT_REFUSED
    assert _status(monkeypatch, "table", "create", "robots.t", "--column", "b:int64", *data) == (
        EXIT_REFUSED
    )


def test_an_unreachable_server_exits_75(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metasrv not answering is an outage to retry, not the caller's mistake."""
    monkeypatch.setattr(admin_cli, "CONNECT_WAIT_S", 1.0)
    dead = f"127.0.0.1:{free_port()}"
    for command in (["list-tables"], ["describe-table", "robots.t"]):
        assert _status(monkeypatch, "client", "--addr", dead, *command) == EXIT_RETRYABLE
