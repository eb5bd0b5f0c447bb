"""How deeply a statement nests, counted on its tokens before DataFusion parses it.

DataFusion's SQL parser (sqlparser) counts its own recursion and gives up at
50 levels, but close to that limit, and for some forms well below it, it
backtracks exponentially: ``CAST(`` or ``TRY_CAST(`` or ``substring(``
nested 48 deep, or ``NOT (`` nested 36 deep, plan for minutes or never
(measured with DataFusion 54; the time grows about 2.4x per ``NOT (``).
The thread planning it cannot be stopped, so such a statement must never
reach the parser.

:func:`nesting_depth` estimates, without recursing, the parser's recursion
at its deepest point, and never below it: each bracket (``(``, ``[``,
``CASE ... END``) is a level, a SELECT inside it another, and inside each
bracket every operator whose right operand is still open is one more
(``NOT``, unary ``-``/``+``/``~``, and a binary operator while a tighter one
follows it: ``a = -(b)`` is 3 levels inside the parenthesis, as the parser
climbs the precedences). A flat chain ``a AND b AND c`` stays one level:
its terms are bounded by ``LAKE_QUERY_MAX_EXPRESSION_TERMS`` instead.
``tests/test_hostile_sql.py`` fuzzes every form against DataFusion itself.
"""

from __future__ import annotations

import re

__all__ = ["nesting_depth"]

_TOKEN = re.compile(
    r"'(?:[^']|'')*'?"
    r'|"(?:[^"]|"")*"?'
    r"|`(?:[^`]|``)*`?"
    r"|--[^\n]*"
    r"|/\*.*?(?:\*/|\Z)"
    r"|\$\d+"
    r"|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"
    r"|\.[0-9]+"
    r"|[A-Za-z_][A-Za-z0-9_$]*"
    r"|::|<=>|<>|!=|<=|>=|\|\||<<|>>|->>|->|=>"
    r"|[-+*/%=<>&|^~!(),\[\];.:{}@#?]",
    re.DOTALL,
)

# Binary operators by precedence (higher binds tighter), as the parser climbs them.
_BINARY = {
    "OR": 5,
    "XOR": 6,
    "AND": 10,
    "IS": 20,
    "LIKE": 20,
    "ILIKE": 20,
    "SIMILAR": 20,
    "IN": 20,
    "BETWEEN": 20,
    "REGEXP": 20,
    "RLIKE": 20,
    "=": 20,
    "<": 20,
    ">": 20,
    "<=": 20,
    ">=": 20,
    "<>": 20,
    "!=": 20,
    "<=>": 20,
    "=>": 20,
    "|": 21,
    "^": 22,
    "&": 23,
    "<<": 24,
    ">>": 24,
    "#": 24,
    "+": 30,
    "-": 30,
    "||": 30,
    "->": 30,
    "->>": 30,
    "@": 30,
    "*": 40,
    "/": 40,
    "%": 40,
    "DIV": 40,
    "AT": 45,
    "COLLATE": 45,
    "::": 50,
    ":": 50,
    ".": 55,
}
# Prefix operators: their operand is parsed one level down.
_PREFIX = {"NOT": 15, "-": 50, "+": 50, "~": 50, "!": 50, "PRIOR": 50, "EXISTS": 50}
# Words that start a new expression in the same bracket (the operators before are complete).
_CLAUSES = frozenset(
    {
        "SELECT",
        "FROM",
        "WHERE",
        "GROUP",
        "BY",
        "HAVING",
        "ORDER",
        "LIMIT",
        "OFFSET",
        "FETCH",
        "JOIN",
        "ON",
        "USING",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "MINUS",
        "WITH",
        "RECURSIVE",
        "AS",
        "WHEN",
        "THEN",
        "ELSE",
        "DISTINCT",
        "ALL",
        "ASC",
        "DESC",
        "NULLS",
        "WINDOW",
        "OVER",
        "PARTITION",
        "QUALIFY",
        "VALUES",
        "LATERAL",
        "CROSS",
        "INNER",
        "OUTER",
        "FULL",
        "NATURAL",
        "ROWS",
        "RANGE",
        "PRECEDING",
        "FOLLOWING",
        "UNBOUNDED",
        "CURRENT",
        "FILTER",
        "WITHIN",
        "EXPLAIN",
        "ANALYZE",
        "VERBOSE",
        "FOR",
        "ESCAPE",
    }
)
# Words after which an operator is binary (they end an operand).
_OPERAND_WORDS = frozenset({"NULL", "TRUE", "FALSE", "END"})
_KEYWORDS = _CLAUSES | frozenset(_BINARY) | frozenset(_PREFIX) | {"CASE", "END"}
_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")
#: Every symbol token that is not an operand.
_SYMBOLS = frozenset(_BINARY) | frozenset(_PREFIX) | _OPEN | _CLOSE | {",", ";"}


class _Bracket:
    """One open bracket: its own weight and the operators open inside it."""

    __slots__ = ("base", "between", "case", "operators", "select")

    def __init__(self, base: int, *, case: bool = False) -> None:
        self.base = base
        self.case = case
        self.select = False
        #: BETWEEN operators whose AND is still to come.
        self.between = 0
        self.operators: list[int] = []

    def weight(self) -> int:
        return self.base + self.select + len(self.operators)


def nesting_depth(sql: str, stop_at: int | None = None) -> int:
    """The deepest nesting of ``sql`` (see the module docstring), at least the parser's.

    ``stop_at``: return as soon as the depth exceeds it.
    """
    stack = [_Bracket(0)]
    depth = deepest = 0  # depth: the sum of the open brackets' weights
    operand = False  # the previous token ended an operand
    for match in _TOKEN.finditer(sql):
        token = match.group()
        first = token[0]
        top = stack[-1]
        if first in "'\"`$" or first.isdigit() or (first == "." and len(token) > 1):
            operand = True
            continue
        if token.startswith(("--", "/*")):
            continue
        word = token.upper() if first.isalpha() or first == "_" else token
        if word not in _KEYWORDS and word not in _SYMBOLS:
            operand = True  # a name (column, table, function, type): nests nothing
            continue
        before = top.weight()
        if first in _OPEN or word == "CASE":
            stack.append(_Bracket(1, case=word == "CASE"))
            operand = False
        elif first in _CLOSE or word == "END":
            if len(stack) > 1 and (word == "END") == stack[-1].case:
                depth -= stack.pop().weight()
            operand = True
            continue
        elif word in (",", ";"):
            top.operators.clear()
            operand = False
        elif word == "SELECT":
            top.operators.clear()
            top.select = True
            operand = False
        elif word in _CLAUSES:
            top.operators.clear()
            operand = False
        elif operand and word == "NOT":
            continue  # NOT LIKE, NOT IN, IS NOT ...: part of the operator that follows
        elif word == "AND" and top.between:
            top.between -= 1
            _binary(top.operators, _BINARY["BETWEEN"])
            operand = False
        elif operand and word in _BINARY:
            top.between += word == "BETWEEN"
            _binary(top.operators, _BINARY[word])
            operand = False
        elif word in _PREFIX:
            top.operators.append(_PREFIX[word])
            operand = False
        elif word in _BINARY:
            operand = False  # an operator where an operand was due: the parser refuses it
        else:
            operand = word in _OPERAND_WORDS
            continue
        depth += stack[-1].weight() - before if stack[-1] is top else stack[-1].weight()
        if depth > deepest:
            deepest = depth
            if stop_at is not None and deepest > stop_at:
                return deepest
    return deepest


def _binary(operators: list[int], precedence: int) -> None:
    """Close the operators ``precedence`` completes, then open it."""
    while operators and operators[-1] >= precedence:
        operators.pop()
    operators.append(precedence)
