"""A snapshot of every ``lake`` command's ``--help`` (docs/cli.md), and what it must show."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tools.codegen.cli_help import render

#: Commands that print a result, and so take --output.
RESULT_COMMANDS = (
    "lake client create-table",
    "lake client describe-table",
    "lake client drop-table",
    "lake client list-tables",
    "lake client optimize-table",
    "lake client create-index",
    "lake client verify-table",
    "lake table create",
    "lake table list",
    "lake table describe",
    "lake table drop",
    "lake table optimize",
    "lake table index",
    "lake table verify",
    "lake segments ship",
    "lake iceberg registrar",
)
REPO = Path(__file__).resolve().parents[2]
TYPES = "Types: utf8 (alias string), int32, int64, float32, float64, bool, timestamp"


def _sections(page: str) -> dict[str, str]:
    return dict(re.findall(r"^## `([^`]+)`\n\n```text\n(.*?)\n```", page, re.S | re.M))


def test_the_page_is_the_commands_help() -> None:
    # Rendered by a fresh interpreter: click keeps each command's help option from
    # the first time it is asked, so a test that ran a subcommand on its own here
    # (without the root's -h) would show through as '--help'.
    done = subprocess.run(
        [sys.executable, "-m", "tools.codegen.cli_help", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_help_shows_the_documented_types_and_defaults() -> None:
    sections = _sections(render())
    for command in RESULT_COMMANDS:
        flat = " ".join(sections[command].split())
        assert "-o, --output [text|json]" in flat, command
    for command in ("lake client create-table", "lake table create"):
        flat = " ".join(sections[command].split())
        assert TYPES in flat
        assert "binary, file." in flat
        assert "--if-not-exists" in flat
    for command in ("lake client create-index", "lake table index"):
        # Choices and default spelled alike (0.1 showed [btree|bitmap] with default BTREE).
        assert "--kind [btree|bitmap] Scalar index kind. [default: btree]" in " ".join(
            sections[command].split()
        )
    sql = " ".join(sections["lake sql"].split())
    assert "-o, --output [table|json|csv]" in sql
    assert "[default: table]" in sql
    assert "[default: grpc://127.0.0.1:50051]" in sql
    assert "Usage: lake sql [OPTIONS] [STATEMENT]" in sql
