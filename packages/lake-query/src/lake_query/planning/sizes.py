"""What built-in functions do to the size of their inputs (for the amplification bound).

Tables of names :mod:`~lake_query.planning.amplification` consults, and the
exact output size of a bounded call whose arguments are literals.
"""

from __future__ import annotations

import re
from typing import Any

from lake_query.planning.functions import BOUNDED_FUNCTIONS, SIZED_FUNCTIONS

__all__ = [
    "ACCUMULATING",
    "AMPLIFYING",
    "CAST_GROWTH",
    "FIXED",
    "FIXED_AGGREGATES",
    "GROWTH",
    "PICKING",
    "WRITTEN",
    "casts_to_fixed",
    "literal_bytes",
    "literal_output",
    "may_amplify",
    "subquery_computes_large_values",
]

#: Built-ins whose result has a fixed size whatever their arguments.
FIXED = frozenset(
    {
        "length",
        "char_length",
        "character_length",
        "octet_length",
        "bit_length",
        "cardinality",
        "array_length",
        "strpos",
        "instr",
        "position",
        "ascii",
        "md5",
        "sha224",
        "sha256",
        "sha384",
        "sha512",
        "digest",
        "starts_with",
        "ends_with",
        "array_has",
        "array_has_all",
        "array_has_any",
        "array_position",
        "regexp_like",
        "regexp_count",
        "levenshtein",
        "date_part",
        "extract",
        "date_trunc",
        "to_timestamp",
        "now",
        "random",
        "abs",
        "round",
        "floor",
        "ceil",
        "isnan",
        "iszero",
    }
)
#: Aggregates (and window functions) with fixed-size results.
FIXED_AGGREGATES = frozenset(
    {
        "count",
        "sum",
        "avg",
        "mean",
        "stddev",
        "stddev_pop",
        "stddev_samp",
        "var",
        "var_pop",
        "var_samp",
        "bool_and",
        "bool_or",
        "approx_distinct",
        "approx_median",
        "approx_percentile_cont",
        "median",
        "row_number",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "ntile",
        "corr",
        "covar_pop",
        "covar_samp",
        "bit_and",
        "bit_or",
        "bit_xor",
        "grouping",
    }
)
#: Aggregates whose value holds every input value of its group.
ACCUMULATING = frozenset({"string_agg", "array_agg", "listagg"})
#: Aggregates and window functions whose result is one of their input values.
PICKING = frozenset(
    {"min", "max", "first_value", "last_value", "nth_value", "lag", "lead", "any_value"}
)
#: How many bytes one input byte can become (UTF-8 case mapping grows a
#: character to at most three; a cast to text writes a number's digits).
GROWTH = {
    "upper": 3.0,
    "lower": 3.0,
    "initcap": 3.0,
    "translate": 4.0,
    "encode": 2.0,
    "to_hex": 3.0,
    "string_to_array": 5.0,
    "string_to_list": 5.0,
    "regexp_match": 5.0,
    "split_part": 1.0,
}
CAST_GROWTH = 3.0
FIXED_TYPES_X = (
    "Int",
    "UInt",
    "Float",
    "Decimal",
    "Boolean",
    "Date",
    "Time",
    "Interval",
    "Duration",
)
#: Functions that may write some arguments (their positions) once per input
#: byte: a replacement (whose ``$1`` references copy a match), a separator.
WRITTEN: dict[str, tuple[int, ...]] = {
    "replace": (2,),
    "regexp_replace": (2,),
    "array_to_string": (1, 2),
    "array_join": (1, 2),
    "list_to_string": (1, 2),
}


def literal_bytes(expr: Any) -> int | None:
    """The size of a string or binary literal (None for anything else)."""
    if expr.variant_name() != "Literal":
        return None
    value = expr.python_value()
    value = value.as_py() if hasattr(value, "as_py") else value
    if isinstance(value, str):
        return len(value.encode())
    return len(value) if isinstance(value, bytes) else None


def _literal_int(expr: Any) -> int | None:
    if expr.variant_name() != "Literal":
        return None
    value = expr.python_value()
    value = value.as_py() if hasattr(value, "as_py") else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def literal_output(name: str, args: list[Any]) -> int | None:
    """The output bytes of a bounded call on literal arguments (None: not known)."""
    ints = [_literal_int(a) for a in args]
    if name in ("range", "generate_series") and len(args) in (2, 3) and None not in ints:
        start, stop, step = ints[0] or 0, ints[1] or 0, (ints[2] if len(args) == 3 else 1) or 1
        return 8 * (max(0, (stop - start) // step) + 1)
    if len(args) < 2 or ints[1] is None:
        return None
    count = max(0, ints[1])
    if name == "repeat":
        size = literal_bytes(args[0])
        return None if size is None else size * count
    if name in SIZED_FUNCTIONS:
        return SIZED_FUNCTIONS[name] * count
    element = literal_bytes(args[0])
    return 8 * count if name == "array_repeat" and element is None else None


def casts_to_fixed(expr: Any) -> bool:
    # The target type is only shown in the expression's canonical name.
    name = expr.canonical_name()
    target = name[name.rfind(" AS ") + 4 :]
    return target.startswith(FIXED_TYPES_X)


#: Functions that concatenate, repeat or grow values. The walk runs only when
#: the plan names one of them (or ``||``, or a recursive CTE): without them no
#: value holds more than one copy of what it reads, and a point query is not
#: charged the walk (~150 us) but one regex over the plan's text (~2 us).
AMPLIFYING = frozenset(
    {
        *BOUNDED_FUNCTIONS,
        *SIZED_FUNCTIONS,
        *GROWTH,
        *WRITTEN,
        "concat",
        "concat_ws",
        "overlay",
        "array_concat",
        "array_cat",
        "list_concat",
        "list_cat",
        "array_append",
        "array_prepend",
        "list_append",
        "list_prepend",
        "array_push_back",
        "array_push_front",
        "make_array",
        "make_list",
        "array_union",
        "array_replace",
        "array_replace_n",
        "array_replace_all",
        "list_replace",
        "list_replace_n",
        "list_replace_all",
        "flatten",
        "struct",
        "named_struct",
        "make_map",
        "map",
        "string_agg",
        "array_agg",
        "listagg",
    }
)
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\(")


def may_amplify(plan_text: str) -> bool:
    """Whether a plan's text names ``||``, a recursive CTE or an :data:`AMPLIFYING` call."""
    # One scan for call names and a set lookup: an alternation of every name
    # tried at each position costs ~25 us on a point query's plan, this ~2 us.
    if "||" in plan_text or "RecursiveQuery" in plan_text:
        return True
    return any(m.group(1).lower() in AMPLIFYING for m in _CALL.finditer(plan_text))


#: Calls that make a value large by themselves (not only by combining others).
_LARGE = frozenset({*BOUNDED_FUNCTIONS, *SIZED_FUNCTIONS, *ACCUMULATING})


def subquery_computes_large_values(plan_text: str) -> bool:
    """Whether a ``Subquery:`` block of an indented plan calls one of :data:`_LARGE`."""
    inside: int | None = None  # indentation of the Subquery: line we are under
    for line in plan_text.splitlines():
        indent = len(line) - len(line.lstrip())
        if inside is not None and indent <= inside:
            inside = None
        if inside is None:
            if line.strip() == "Subquery:":
                inside = indent
            continue
        if any(m.group(1).lower() in _LARGE for m in _CALL.finditer(line)):
            return True
    return False
