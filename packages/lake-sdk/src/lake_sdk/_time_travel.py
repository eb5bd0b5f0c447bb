"""Time travel as SQL: what ``query(..., as_of=...)`` and ``lake sql --as-of`` send.

Query reads an old version of a table when its name carries a selector,
``lake.ns."t@v3"`` or ``lake.ns."t@2026-11-30T12:00:00Z"``, and lists the
retained versions as ``lake.ns."t$versions"``. :func:`as_of_sql` rewrites
every fully qualified ``lake.<namespace>.<table>`` reference in a statement
to carry the same selector, so the options are sugar over that SQL and mean
exactly what it means. String literals, comments and names that already
carry a selector are left alone.
"""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime
from typing import Final

from lake_core.errors import InvalidArgument
from lake_core.names import DEFAULT_CATALOG, TableRef

__all__ = ["AsOf", "as_of_sql", "selector", "versions_sql"]

#: A version number, an aware datetime, or the text ``lake sql --as-of`` takes.
AsOf = int | datetime | str

# One token at a time: a string literal, a comment, a quoted or bare name,
# a dot, or anything else (a single character).
_TOKEN: Final = re.compile(
    r"""(?P<string>'(?:[^']|'')*'?)
      | (?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))
      | (?P<quoted>"(?:[^"]|"")*"?)
      | (?P<bare>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<dot>\.)
      | (?P<space>\s+)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_VERSION_TEXT: Final = re.compile(r"v?(\d{1,18})")


def selector(as_of: AsOf) -> str:
    """The table-name suffix for ``as_of``: ``@v3`` or ``@2026-11-30T12:00:00Z``."""
    if isinstance(as_of, bool):
        raise InvalidArgument("as_of must be a version number or a datetime, not a bool")
    if isinstance(as_of, int):
        if as_of < 0:
            raise InvalidArgument(f"as_of version must be >= 0, got {as_of}")
        return f"@v{as_of}"
    if isinstance(as_of, datetime):
        if as_of.tzinfo is None or as_of.utcoffset() is None:
            raise InvalidArgument(
                "as_of datetime must carry a time zone (for example tzinfo=datetime.UTC)"
            )
        instant = as_of.astimezone(UTC)
        text = instant.strftime("%Y-%m-%dT%H:%M:%S")
        if instant.microsecond:
            text += f".{instant.microsecond:06d}"
        return f"@{text}Z"
    if isinstance(as_of, str):
        text = as_of.strip()
        number = _VERSION_TEXT.fullmatch(text)
        if number:
            return f"@v{int(number.group(1))}"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidArgument(
                f"as_of {as_of[:80]!r} is neither a version (3 or v3) nor an "
                "RFC 3339 UTC instant (2026-11-30T12:00:00Z)"
            ) from None
        if parsed.tzinfo is None:
            raise InvalidArgument(f"as_of {as_of[:80]!r} must end in Z (UTC)")
        return selector(parsed)
    raise InvalidArgument(
        f"as_of must be a version number or a datetime, got {type(as_of).__name__}"
    )


def _name(token: str) -> str:
    if token.startswith('"'):
        return token[1:-1].replace('""', '"')
    return token.lower()  # bare names fold to lowercase, as DataFusion folds them


def as_of_sql(sql: str, as_of: AsOf) -> str:
    """``sql`` with every ``lake.<namespace>.<table>`` read at ``as_of``.

    Raises InvalidArgument if the statement names no such table (a partly
    qualified name, ``ns.t`` or ``t``, cannot be told from a column here).
    """
    suffix = selector(as_of)
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(sql)]
    names = [i for i, (kind, _) in enumerate(tokens) if kind in ("bare", "quoted")]
    rewritten = dict[int, str]()
    for position, start in enumerate(names):
        parts = names[position : position + 3]
        if len(parts) < 3 or _name(tokens[start][1]) != DEFAULT_CATALOG:
            continue
        if not all(_dotted(tokens, a, b) for a, b in itertools.pairwise(parts)):
            continue
        if start > 0 and _previous_is_dot(tokens, start):
            continue  # part of a longer name, not a table's catalog
        table = _name(tokens[parts[2]][1])
        if "@" in table or "$" in table:
            continue  # an explicit selector wins
        rewritten[parts[2]] = '"' + (table + suffix).replace('"', '""') + '"'
    if not rewritten:
        raise InvalidArgument(
            "as_of applies to fully qualified lake.<namespace>.<table> names, and this SQL has none"
        )
    return "".join(rewritten.get(i, text) for i, (_, text) in enumerate(tokens))


def _dotted(tokens: list[tuple[str | None, str]], left: int, right: int) -> bool:
    """Whether only a dot (and spaces) separates two name tokens."""
    between = [kind for kind, _ in tokens[left + 1 : right] if kind != "space"]
    return between == ["dot"]


def _previous_is_dot(tokens: list[tuple[str | None, str]], index: int) -> bool:
    for kind, _ in reversed(tokens[:index]):
        if kind != "space":
            return kind == "dot"
    return False


def versions_sql(table: TableRef | str) -> str:
    """The query listing ``table``'s retained versions, oldest first."""
    ref = table if isinstance(table, TableRef) else TableRef.parse(table)
    return (
        f'SELECT * FROM {DEFAULT_CATALOG}.{ref.namespace}."{ref.name}$versions" '
        "ORDER BY engine_version"
    )
