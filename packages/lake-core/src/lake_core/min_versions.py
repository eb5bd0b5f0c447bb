"""The ``lake-min-versions`` request header: the table versions a client committed.

A client that appended sends, with its statements, the highest version it
has committed per table::

    lake-min-versions: robots.episodes=42,robots.steps=7

A Query replica whose catalog view is behind any of them (a table it does
not know yet included) refreshes its catalog once before planning, so the
client reads its own writes on any replica. The header is a lower bound
only: it never selects a version, and a table the caller may not see is
ignored.

Bounds: at most :data:`MAX_TABLES` entries and :data:`MAX_HEADER_BYTES`
bytes; each entry is ``namespace.table=version`` with Lake's identifier
rules and a version in ``0..2**63-1``. Anything else is InvalidArgument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from lake_core.errors import InvalidArgument, LakeError
from lake_core.names import TableRef

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_TABLES",
    "MIN_VERSIONS_HEADER",
    "format_min_versions",
    "parse_min_versions",
]

MIN_VERSIONS_HEADER: Final = "lake-min-versions"
#: Most tables one header names (a client sends its most recent commits first).
MAX_TABLES: Final = 32
#: Longest header value accepted.
MAX_HEADER_BYTES: Final = 4096
_MAX_VERSION: Final = 2**63 - 1
_ENTRY = re.compile(r"([^=,\s]{1,200})=(\d{1,19})")


def parse_min_versions(value: str | None) -> dict[TableRef, int]:
    """The header's table -> version map (empty when absent); InvalidArgument if malformed."""
    if value is None or value == "":
        return {}
    if len(value.encode("utf-8", "surrogatepass")) > MAX_HEADER_BYTES:
        raise InvalidArgument(f"{MIN_VERSIONS_HEADER} exceeds {MAX_HEADER_BYTES} bytes")
    entries = value.split(",")
    if len(entries) > MAX_TABLES:
        raise InvalidArgument(f"{MIN_VERSIONS_HEADER} names more than {MAX_TABLES} tables")
    found: dict[TableRef, int] = {}
    for entry in entries:
        match = _ENTRY.fullmatch(entry.strip())
        if match is None:
            raise InvalidArgument(
                f"{MIN_VERSIONS_HEADER}: {entry[:80]!r} is not 'namespace.table=version'"
            )
        version = int(match.group(2))
        if version > _MAX_VERSION:
            raise InvalidArgument(f"{MIN_VERSIONS_HEADER}: version {version} is out of range")
        try:
            table = TableRef.parse(match.group(1))
        except LakeError as exc:
            raise InvalidArgument(f"{MIN_VERSIONS_HEADER}: {exc}") from None
        found[table] = max(version, found.get(table, 0))
    return found


def format_min_versions(versions: Mapping[TableRef, int]) -> str:
    """The header value for ``versions``: its first entries, in the given order, that fit
    :data:`MAX_TABLES` and :data:`MAX_HEADER_BYTES`."""
    entries: list[str] = []
    size = 0
    for table, version in versions.items():
        entry = f"{table}={version}"
        size += len(entry) + (1 if entries else 0)
        if len(entries) == MAX_TABLES or size > MAX_HEADER_BYTES:
            break
        entries.append(entry)
    return ",".join(entries)
