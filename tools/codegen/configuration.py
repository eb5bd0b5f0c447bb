"""Write docs/configuration.md from the LAKE_* catalogue in lake_core.config.

Usage: python -m tools.codegen.configuration [--check]

``--check`` exits non-zero when the committed page differs from what the
catalogue renders (tests/docs/test_configuration.py runs the same check).
"""

from __future__ import annotations

import argparse
import sys
from itertools import groupby
from pathlib import Path

from lake_core.config import EnvVar, all_variables

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"

HEADER = """\
# Configuration

Every `LAKE_*` environment variable Lake reads, generated from
`lake_core.config` (`python -m tools.codegen.configuration`; a test fails when
this page, the catalogue or the code drift apart). Processes validate their
whole configuration before they bind a listener or touch storage, and a bad
value stops startup with an error naming the variable. Secrets are passed as
files (the `*_FILE` variables), never as values.

Flags (`--addr`, `--metadata-addr`, `--data-dir`) are described by each
command's `--help`.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _row(var: EnvVar) -> str:
    return f"| `{var.name}` | {_cell(var.doc)} | {_cell(var.default)} | {_cell(var.range) or '-'} |"


def render() -> str:
    """The whole page, grouped by the process that reads each variable."""
    lines = [HEADER]
    variables = sorted(all_variables(), key=lambda var: (var.owner, var.name))
    for owner, group in groupby(variables, key=lambda var: var.owner):
        lines += [
            f"## Read by {owner}",
            "",
            "| variable | meaning | default | range |",
            "|---|---|---|---|",
        ]
        lines += [_row(var) for var in group]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(REPO)} is stale: run python -m tools.codegen.configuration")
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
