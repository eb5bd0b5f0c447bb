"""The DataFusion messages Lake reads a fact from: here, and nowhere else.

DataFusion (``datafusion>=54,<55``) raises a plain ``ValueError`` or
``Exception`` for every failure. Three facts have no typed error to come
from, so Lake recognises their text:

- a statement DataFusion refuses to plan (``SQLOptions``' DDL, DML and
  statement checks, and statements it does not support) -> :func:`refused`;
- its memory pool refusing an operator more memory -> :func:`out_of_memory`;
- Arrow's checked arithmetic overflowing (``MIN / -1``) -> :func:`overflowed`.

and :func:`without_prefix` drops the ``DataFusion error:`` the Python
bindings put in front of errors from running a plan.

Every pattern has a test that makes the pinned DataFusion produce the real
message (``packages/lake-query/tests/test_datafusion_messages.py``): an
upgrade that rewords one fails there, not in front of a client.

What is *not* read from a message: a table that does not exist (the lazy
catalog records what it could not resolve, :mod:`~lake_query.planning.catalog`)
and any error Lake raised itself (its class travels through DataFusion).
"""

from __future__ import annotations

import re

__all__ = ["out_of_memory", "overflowed", "refused", "without_prefix"]

# "DataFusion error: " once or more, in front of errors from collect() and the like.
_PREFIX = re.compile(r"^(DataFusion error: )+")
# SQLOptions' refusals ("DDL not supported: CreateMemoryTable", "DML not supported:
# Insert Into", "Statement not supported: SetVariable"), statements the SQL planner
# does not support ("Unsupported SQL statement: BEGIN"), and writes nested in a query
# ("Query INSERT INTO t VALUES (1) not implemented yet").
_REFUSAL = re.compile(
    r"(DDL|DML|Statement) not supported"
    r"|Unsupported SQL statement"
    r"|not implemented: Query (INSERT|UPDATE|DELETE|MERGE|REPLACE)\b",
    re.IGNORECASE,
)
# The memory pool: "Resources exhausted: Failed to allocate additional 8.2 KB for ...".
_RESOURCES_EXHAUSTED = re.compile(r"Resources exhausted")
# Arrow's checked kernels: "Arithmetic overflow: Overflow happened on: -9223372036854775808 / -1".
_ARITHMETIC_OVERFLOW = re.compile(r"Arithmetic overflow: Overflow happened on: ([^\n]{1,200})")


def without_prefix(message: str) -> str:
    """``message`` without the bindings' leading ``DataFusion error:`` (however many)."""
    return _PREFIX.sub("", message)


def refused(message: str) -> bool:
    """Whether DataFusion refused to plan the statement for what it is (not a query)."""
    return _REFUSAL.search(message) is not None


def out_of_memory(message: str) -> bool:
    """Whether DataFusion's memory pool refused an operator more memory."""
    return _RESOURCES_EXHAUSTED.search(message) is not None


def overflowed(message: str) -> str | None:
    """The operation Arrow's checked arithmetic overflowed on (``-9223372036854775808 / -1``),
    or None if ``message`` is not an overflow."""
    found = _ARITHMETIC_OVERFLOW.search(message)
    return None if found is None else found.group(1).strip()
