"""SQL nesting of every form, for the planning-bound fuzz tests.

Each form wraps an expression once: :func:`nest` stacks ``depth`` of them
(one form, or a seeded mix), so a test can build statements near and past
the nesting guard (``LAKE_QUERY_MAX_NESTING_DEPTH``) and beyond DataFusion's
parser limit (50), where the parser backtracks for minutes.
"""

from __future__ import annotations

import random

__all__ = ["FORMS", "HANGS", "nest", "nested_statement"]

#: Form name -> (text before the inner expression, text after it).
FORMS: dict[str, tuple[str, str]] = {
    "paren": ("(", ")"),
    "cast": ("CAST(", " AS BIGINT)"),
    "try_cast": ("TRY_CAST(", " AS BIGINT)"),
    "colon_cast": ("(", ")::BIGINT"),
    "not": ("NOT (", ") IS NULL"),
    "not_bare": ("NOT ", " IS NULL"),
    "neg": ("-(", ")"),
    "neg_bare": ("- ", ""),
    "plus": ("+(", ")"),
    "tilde": ("~(", ")"),
    "abs": ("abs(", ")"),
    "coalesce": ("coalesce(NULL, ", ")"),
    "substring": ("substring(CAST(", " AS VARCHAR) FROM 1)"),
    "case": ("CASE WHEN true THEN ", " ELSE 0 END"),
    "case_operand": ("CASE ", " WHEN 1 THEN 1 ELSE 0 END"),
    "subquery": ("(SELECT ", ")"),
    "exists": ("(SELECT CASE WHEN EXISTS (SELECT ", ") THEN 1 ELSE 0 END)"),
    "in_list": ("(1 IN (", ", 2))::BIGINT"),
    "in_subquery": ("(1 IN (SELECT ", "))::BIGINT"),
    "array": ("[", "][1]"),
    "between": ("(1 BETWEEN 0 AND (", "))::BIGINT"),
    "arith": ("1 + 2 * (", ")"),
    "compare": ("((", ") > 0)::BIGINT"),
}

#: Statements the issue measured: they never finished planning before the nesting guard.
HANGS = {
    "cast-48": "SELECT " + "CAST(" * 48 + "1" + " AS BIGINT)" * 48,
    "not-49": "SELECT " + "NOT (" * 49 + "true" + ")" * 49,
    "try-cast-49": "SELECT " + "TRY_CAST(" * 49 + "1" + " AS BIGINT)" * 49,
}


def nest(forms: list[str], leaf: str = "1") -> str:
    """``leaf`` wrapped by each of ``forms``, the first outermost."""
    opening = "".join(FORMS[f][0] for f in forms)
    closing = "".join(FORMS[f][1] for f in reversed(forms))
    return opening + leaf + closing


def nested_statement(rng: random.Random, depth: int, *, mixed: bool | None = None) -> str:
    """A SELECT of one expression nested ``depth`` deep: one form, or (``mixed``) a mix."""
    names = sorted(FORMS)
    if mixed is None:
        mixed = rng.random() < 0.5
    chosen = [rng.choice(names) for _ in range(depth)] if mixed else [rng.choice(names)] * depth
    return "SELECT " + nest(chosen)
