"""docs/configuration.md, the LAKE_* catalogue and the code agree.

- The page is exactly what ``tools.codegen.configuration`` renders.
- No module but ``lake_core.config`` spells a ``LAKE_*`` name as a value
  (they import the constant), so a variable has one home.
- Every ``LAKE_*`` name mentioned anywhere in the packages' source (messages
  and docstrings included) is declared in the catalogue.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lake_core.config import all_variables
from tools.codegen.configuration import PAGE, render

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "packages").glob("*/src/**/*.py"))
CATALOGUE = ROOT / "packages/lake-core/src/lake_core/config.py"
NAME = re.compile(r"\bLAKE_[A-Z0-9_]*[A-Z0-9]\b")


def test_the_page_is_generated_from_the_catalogue() -> None:
    assert PAGE.read_text() == render(), "run: python -m tools.codegen.configuration"


def test_every_variable_has_one_home() -> None:
    spelled: list[str] = []
    for path in SOURCES:
        if path == CATALOGUE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"LAKE_[A-Z0-9_]+", node.value)
            ):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not spelled, "import these from lake_core.config instead:\n" + "\n".join(spelled)


def test_every_mentioned_variable_is_declared() -> None:
    declared = {var.name for var in all_variables()}
    mentioned: dict[str, str] = {}
    for path in SOURCES:
        for name in NAME.findall(path.read_text()):
            mentioned.setdefault(name, str(path.relative_to(ROOT)))
    missing = {name: where for name, where in mentioned.items() if name not in declared}
    assert not missing, f"declare in lake_core.config: {missing}"


def test_declarations_are_complete() -> None:
    for var in all_variables():
        assert var.doc.endswith("."), var.name
        assert var.owner, var.name
        assert var.default, var.name
