"""Bounds on what one statement may make DataFusion do.

DataFusion recurses through expressions and plans: a left-deep operator
chain of ~2,000 terms (``SELECT 1+1+...``) overflows a 2 MiB tokio worker
stack while it executes, ~20,000 overflow the planning thread, and a chain
of ~300 CTEs, each a Projection over a Filter, overflows execution too
(measured with DataFusion 54). A stack overflow kills the replica, so the
bounds are checked by code that does not recurse:

- before planning, on the SQL tokens: binary operators per statement
  (``LAKE_QUERY_MAX_EXPRESSION_TERMS``), SELECT blocks per statement
  (``LAKE_QUERY_MAX_QUERY_BLOCKS``) and nesting of every form
  (``LAKE_QUERY_MAX_NESTING_DEPTH``, :mod:`~lake_query.planning.nesting`):
  DataFusion's parser stops at 50 levels, but near that limit, and for
  ``NOT (`` well below it, it backtracks for minutes;
- after planning, before execution: the logical plan's depth
  (``LAKE_QUERY_MAX_PLAN_DEPTH``), walked iteratively, and how large its
  values may grow by concatenation and repetition
  (:mod:`~lake_query.planning.amplification`, RESOURCE_EXHAUSTED).

Exceeding one is INVALID_ARGUMENT naming the limit and its setting. The
token scan also finds ``$N`` placeholders, so a statement run with a
parameter left unbound is refused as the client's error before it runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lake_core.config import QUERY_MAX_EXPRESSION_TERMS as MAX_EXPRESSION_TERMS
from lake_core.config import QUERY_MAX_NESTING_DEPTH as MAX_NESTING_DEPTH
from lake_core.config import QUERY_MAX_PLAN_DEPTH as MAX_PLAN_DEPTH
from lake_core.config import QUERY_MAX_QUERY_BLOCKS as MAX_QUERY_BLOCKS
from lake_core.config import QUERY_MEMORY_LIMIT_BYTES as MEMORY_LIMIT_BYTES
from lake_core.config import QUERY_MEMORY_POOLS_PER_TENANT as MEMORY_POOLS_PER_TENANT
from lake_core.config import env_int
from lake_core.errors import InvalidArgument, QueryTooLarge
from lake_query.planning.amplification import check_amplification
from lake_query.planning.functions import (
    BOUNDED_FUNCTIONS,
    MAX_FUNCTION_OUTPUT_BYTES,
    ROWS_PER_BATCH,
    SIZED_FUNCTIONS,
)
from lake_query.planning.nesting import nesting_depth

__all__ = [
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "MAX_EXPRESSION_TERMS",
    "MAX_NESTING_DEPTH",
    "MAX_PLAN_DEPTH",
    "MAX_QUERY_BLOCKS",
    "MEMORY_LIMIT_BYTES",
    "QueryLimits",
    "SqlShape",
    "sql_shape",
]


DEFAULT_MEMORY_LIMIT_BYTES = 2 * 1024**3
#: Each query's pool is this share of the replica's memory limit, so at most
#: this many queries run DataFusion operators at once (more wait, then are refused).
MEMORY_SHARES = 4

_SYMBOL_OPERATORS = (
    "<=>",
    "<>",
    "!=",
    "<=",
    ">=",
    "||",
    "<<",
    ">>",
    "+",
    "-",
    "*",
    "/",
    "%",
    "=",
    "<",
    ">",
    "&",
    "|",
    "^",
)
_WORD_OPERATORS = frozenset({"AND", "OR", "LIKE", "ILIKE", "IS", "BETWEEN"})
_QUOTES = frozenset("'\"`")
# Longest operators first, so that "<=>" is one operator and not "<=" and ">".
_TOKEN = re.compile(
    r"'(?:[^']|'')*'?"
    r'|"(?:[^"]|"")*"?'
    r"|`(?:[^`]|``)*`?"
    r"|--[^\n]*"
    r"|/\*.*?(?:\*/|\Z)"
    r"|\$\d+"
    r"|[A-Za-z_][A-Za-z0-9_]*"
    r"|" + "|".join(re.escape(symbol) for symbol in _SYMBOL_OPERATORS),
    re.DOTALL,
)
_WORD_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")


@dataclass(frozen=True)
class SqlShape:
    """What a token scan of one statement found."""

    operators: int
    selects: int
    #: The highest ``$N`` placeholder (0 for none; numbers past 18 digits count as 10**18).
    max_placeholder: int
    #: Names (bare or quoted, lower-cased) of bounded built-ins the text mentions.
    bounded_functions: frozenset[str] = frozenset()
    #: Each call of a :data:`SIZED_FUNCTIONS` built-in: its name and the text of
    #: its size argument (None when the call has none or does not parse).
    sized_calls: tuple[tuple[str, str | None], ...] = ()
    #: The highest placeholder as the statement wrote it (``$12``), for messages.
    placeholder_name: str = ""


def _skip_quoted(sql: str, i: int) -> int:
    """The index just past the quoted token starting at ``sql[i]``."""
    ch, end, n = sql[i], i + 1, len(sql)
    while True:
        end = sql.find(ch, end)
        if end < 0:
            return n
        if end + 1 < n and sql[end + 1] == ch:  # a doubled quote escapes itself
            end += 2
            continue
        return end + 1


def _is_call(sql: str, i: int) -> bool:
    """Whether the name ending at ``sql[i]`` is called (not a column of that name)."""
    # A comment may stand before the parenthesis: count it as a call (refused
    # unless its size is a plain literal), as is a name followed by much space.
    rest = sql[i : i + 256].lstrip()
    return rest.startswith(("(", "/*", "--")) or (rest == "" and len(sql) - i > 256)


def _argument(sql: str, i: int, index: int) -> str | None:
    """The text of argument ``index`` of the call whose name ends at ``sql[i]``."""
    n = len(sql)
    while i < n and sql[i].isspace():
        i += 1
    if i >= n or sql[i] != "(":
        return None
    depth, argument, start, i = 1, 0, i + 1, i + 1
    while i < n:
        ch = sql[i]
        if ch in "'\"`":
            i = _skip_quoted(sql, i)
            continue
        if sql.startswith("--", i) or sql.startswith("/*", i):
            return None  # a comment inside the call: not a plain literal
        if ch == "(":
            depth += 1
        elif ch in "),":
            if depth == 1:
                if argument == index:
                    return sql[start:i].strip()
                if ch == ")":
                    return None
                argument, start = argument + 1, i + 1
            if ch == ")":
                depth -= 1
        i += 1
    return None


def sql_shape(sql: str) -> SqlShape:
    """Scan ``sql``'s tokens once, skipping literals, quoted names and comments."""
    operators = selects = placeholder = 0
    placeholder_name = ""
    functions: set[str] = set()
    sized: list[tuple[str, str | None]] = []
    # One C-level regex finds the tokens; Python looks only at those (a statement
    # of a few dozen characters costs a few microseconds, not one step per character).
    for match in _TOKEN.finditer(sql):
        token = match.group()
        first = token[0]
        if first in _QUOTES:
            if first != "'":
                name = token[1:-1].lower() if token.endswith(first) else token[1:].lower()
                if name in BOUNDED_FUNCTIONS:
                    functions.add(name)
                elif name in SIZED_FUNCTIONS and _is_call(sql, match.end()):
                    sized.append((name, _argument(sql, match.end(), 1)))
        elif first == "$":
            digits = token[1:].lstrip("0") or "0"
            number = int(digits) if len(digits) <= 18 else 10**18
            if number > placeholder or not placeholder_name:
                placeholder, placeholder_name = number, token
        elif first in _WORD_START:
            word = token.upper()
            if word in _WORD_OPERATORS:
                operators += 1
            elif word == "SELECT":
                selects += 1
            else:
                lower = token.lower()
                if lower in BOUNDED_FUNCTIONS:
                    functions.add(lower)
                elif lower in SIZED_FUNCTIONS and _is_call(sql, match.end()):
                    sized.append((lower, _argument(sql, match.end(), 1)))
        elif not token.startswith(("--", "/*")):
            operators += 1
    return SqlShape(
        operators, selects, placeholder, frozenset(functions), tuple(sized), placeholder_name
    )


def plan_depth(plan: Any, stop_at: int) -> int:
    """The depth of a DataFusion logical plan, walked without recursion (capped at ``stop_at``)."""
    deepest = 0
    stack = [(plan, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > stop_at:
            return deepest
        stack.extend((child, depth + 1) for child in node.inputs())
    return deepest


@dataclass(frozen=True)
class QueryLimits:
    """Per-statement bounds (see the module docstring)."""

    max_expression_terms: int = 512
    max_query_blocks: int = 256
    max_plan_depth: int = 96
    #: Deepest nesting of one statement's text (:mod:`~lake_query.planning.nesting`).
    max_nesting_depth: int = 32
    #: DataFusion memory of all of a replica's running queries together.
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES
    #: DataFusion memory pool of one query while the replica has room (sorts, joins,
    #: aggregates spill past it), reserved from ``memory_limit_bytes`` while it runs;
    #: smaller when other queries hold the memory.
    query_memory_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES // MEMORY_SHARES
    #: How many full pools one tenant's queries may hold at once (the rest stay for others).
    memory_pools_per_tenant: int = 2
    #: Queries admission runs at once, on the replica and per tenant: each pool granted
    #: leaves the least pool for each of them (:mod:`~lake_query.planning.reservations`).
    memory_slots: int = 64
    memory_slots_per_tenant: int = 8
    #: How long a query waits for its pool when the replica's memory is taken
    #: (the replica sets it to its admission queue deadline).
    memory_wait_ms: int = 100
    #: False turns every guard here off (and the replica memory budget): only
    #: for measuring what the guards cost (``tools/bench/guards_bench.py``).
    enforce: bool = True
    #: Largest output of one size-amplifying function call over one batch.
    max_function_output_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> QueryLimits:
        source = os.environ if env is None else env
        d = cls()
        memory = env_int(MEMORY_LIMIT_BYTES, DEFAULT_MEMORY_LIMIT_BYTES, 16 << 20, 1 << 44, source)
        return cls(
            max_expression_terms=env_int(
                MAX_EXPRESSION_TERMS, d.max_expression_terms, 1, 100_000, source
            ),
            max_query_blocks=env_int(MAX_QUERY_BLOCKS, d.max_query_blocks, 1, 100_000, source),
            max_plan_depth=env_int(MAX_PLAN_DEPTH, d.max_plan_depth, 4, 10_000, source),
            max_nesting_depth=env_int(MAX_NESTING_DEPTH, d.max_nesting_depth, 4, 40, source),
            memory_limit_bytes=memory,
            query_memory_bytes=memory // MEMORY_SHARES,
            memory_pools_per_tenant=env_int(
                MEMORY_POOLS_PER_TENANT, d.memory_pools_per_tenant, 1, MEMORY_SHARES, source
            ),
            max_function_output_bytes=env_int(
                MAX_FUNCTION_OUTPUT_BYTES, d.max_function_output_bytes, 1024, 1 << 34, source
            ),
        )

    def check_text(self, sql: str, bound_parameters: int | None) -> SqlShape:
        """Refuse ``sql`` before DataFusion parses it (``bound_parameters``: None skips)."""
        if not self.enforce:
            return SqlShape(0, 0, 0)
        shape = sql_shape(sql)
        if shape.operators > self.max_expression_terms:
            raise InvalidArgument(
                f"the statement has {shape.operators} operators, more than the limit of "
                f"{self.max_expression_terms} ({MAX_EXPRESSION_TERMS})"
            )
        if shape.selects > self.max_query_blocks:
            raise InvalidArgument(
                f"the statement has {shape.selects} SELECT blocks, more than the limit of "
                f"{self.max_query_blocks} ({MAX_QUERY_BLOCKS})"
            )
        nesting = nesting_depth(sql, self.max_nesting_depth)
        if nesting > self.max_nesting_depth:
            raise InvalidArgument(
                f"the statement nests more than {self.max_nesting_depth} levels deep "
                f"({MAX_NESTING_DEPTH}: brackets, calls, CAST, CASE, subqueries, NOT and "
                "unary operators each count); flatten it"
            )
        for name, size in shape.sized_calls:
            self._check_size(name, size)
        if bound_parameters is not None and shape.max_placeholder > bound_parameters:
            name = shape.placeholder_name
            shown = (
                name if len(name) <= 40 else f"{name[:20]}...{name[-8:]} ({len(name) - 1} digits)"
            )
            raise InvalidArgument(
                f"parameter {shown} has no bound value "
                f"({bound_parameters} bound); bind every $N placeholder"
            )
        return shape

    def sized_limit(self, name: str) -> int:
        """The largest size argument a :data:`SIZED_FUNCTIONS` call may take."""
        return self.max_function_output_bytes // (SIZED_FUNCTIONS[name] * ROWS_PER_BATCH)

    def _check_size(self, name: str, size: str | None) -> None:
        # One batch of outputs is its rows times the size: the size alone must keep
        # that within the bound, so it has to be known before the query runs.
        limit = self.sized_limit(name)
        text = (size or "").lstrip("+-")
        if not (text.isascii() and text.isdigit() and len(text) <= 18 and int(text) <= limit):
            raise QueryTooLarge(
                f"{name}() takes an integer literal size of at most {limit} here, so that "
                f"its output stays within {self.max_function_output_bytes} bytes per batch "
                f"({MAX_FUNCTION_OUTPUT_BYTES})"
            )

    def check_plan(self, df: Any) -> None:
        """Refuse a planned statement too deep to execute safely or whose values
        may outgrow the query's memory (:mod:`~lake_query.planning.amplification`)."""
        if not self.enforce:
            return
        plan = df.logical_plan()
        depth = plan_depth(plan, self.max_plan_depth)
        if depth > self.max_plan_depth:
            raise InvalidArgument(
                f"the statement's plan is more than {self.max_plan_depth} operators deep "
                f"({MAX_PLAN_DEPTH}); split it or use fewer nested CTEs and subqueries"
            )
        check_amplification(plan, self.max_function_output_bytes, self.query_memory_bytes)
