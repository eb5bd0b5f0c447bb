"""Sharded scans: which endpoints of a pinned query one shard reads.

Query splits a plain scan of one table (columns, maybe a filter) into
endpoints by fragment ranges of the pinned version; every other query has
one endpoint. Shard ``(index, count)`` reads the endpoints whose position ``j``
has ``j % count == index``. So the shards are disjoint and together give
exactly the result, and for the same pin the same shard gets the same rows.
A query of one endpoint (ORDER BY, aggregates, LIMIT, joins, small tables)
goes whole to shard 0 and the other shards are empty: correct, not balanced.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

from lake_core.errors import InvalidArgument

__all__ = ["check_as_of", "check_shard", "shard_endpoints"]

E = TypeVar("E")


def check_shard(shard: object) -> tuple[int, int] | None:
    """``(index, count)`` with ``0 <= index < count``, or None for the whole result."""
    if shard is None:
        return None
    if (
        not isinstance(shard, tuple)
        or len(shard) != 2
        or not all(type(part) is int for part in shard)
        or not 0 <= shard[0] < shard[1]
    ):
        raise InvalidArgument(
            f"shard must be (index, count) with 0 <= index < count, got {shard!r}"
        )
    return shard[0], shard[1]


def check_as_of(as_of: object) -> int | datetime | None:
    """A version number (>= 1) or an aware datetime, or None for the current versions."""
    if as_of is None:
        return None
    if type(as_of) is int and as_of >= 1:
        return as_of
    if isinstance(as_of, datetime) and as_of.tzinfo is not None:
        return as_of
    raise InvalidArgument(
        f"as_of must be a table version (int >= 1) or a timezone-aware datetime, got {as_of!r}"
    )


def shard_endpoints(endpoints: Sequence[E], shard: tuple[int, int] | None) -> list[E]:
    """The endpoints shard ``(index, count)`` reads, in Query's order."""
    if shard is None:
        return list(endpoints)
    index, count = shard
    return [endpoint for position, endpoint in enumerate(endpoints) if position % count == index]
