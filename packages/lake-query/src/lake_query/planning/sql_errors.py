"""What kind of SQL a request carries, and how DataFusion's errors reach clients.

Lake SQL is read-only. DataFusion's ``SQLOptions`` already refuse DDL, DML and
statements at planning, before anything runs; the keyword check here runs
first so that a write is refused with the one stable :class:`ReadOnlySql`
error before any table is even looked up (``INSERT INTO missing.table``
must not answer "table not found", nor open anything).

Error mapping (DataFusion raises plain ``ValueError``/``Exception``; the few
messages read for a fact are in :mod:`~lake_query.planning.datafusion_messages`):

    a Lake error a table lookup raised (TableNotFound...)  -> itself
    DDL/DML/statement refusals, unsupported statements  -> ReadOnlySql
    the memory pool's "Resources exhausted"              -> QueryTooLarge
    Arrow's "Arithmetic overflow" (``MIN / -1``)           -> IntegerOverflow
    anything else at planning or execution               -> SqlError (DataFusion's message)

A table that does not exist is never read from a message: the lazy catalog
records it (:mod:`~lake_query.planning.catalog`).

A client never sees Rust panic text, source or build paths, or storage
URIs and local paths (:func:`client_message`); the raw message is logged
at WARNING, without the SQL.
"""

from __future__ import annotations

import re

import pyarrow as pa
import structlog

from lake_core.errors import (
    IntegerOverflow,
    Internal,
    LakeError,
    QueryTooLarge,
    ReadOnlySql,
    SqlError,
)
from lake_query.planning import datafusion_messages as messages

__all__ = ["WRITE_KEYWORDS", "client_message", "leading_keyword", "reject_writes", "sql_error"]

log = structlog.get_logger("lake_query.statements")

#: Exceptions only a defect in Lake's code raises (DataFusion, Lance and pyarrow report a
#: statement's faults as their own errors, ValueError or RuntimeError).
_LAKE_BUGS = (IndexError, KeyError, AttributeError, NameError, AssertionError)

#: Statements that are never queries. Checked on the first keyword (after
#: comments, parentheses and an EXPLAIN prefix), so string literals and
#: column names cannot trigger it.
WRITE_KEYWORDS = frozenset(
    {
        "ALTER",
        "ANALYZE",
        "ATTACH",
        "BEGIN",
        "CACHE",
        "CALL",
        "COMMENT",
        "COMMIT",
        "COPY",
        "CREATE",
        "DEALLOCATE",
        "DECLARE",
        "DELETE",
        "DETACH",
        "DISCARD",
        "DROP",
        "EXECUTE",
        "GRANT",
        "INSERT",
        "INSTALL",
        "LOAD",
        "LOCK",
        "MERGE",
        "MSCK",
        "OPTIMIZE",
        "PRAGMA",
        "PREPARE",
        "RELEASE",
        "RENAME",
        "REPLACE",
        "RESET",
        "REVOKE",
        "ROLLBACK",
        "SAVEPOINT",
        "SET",
        "START",
        "TRUNCATE",
        "UNCACHE",
        "UNLOAD",
        "UPDATE",
        "UPSERT",
        "USE",
        "VACUUM",
    }
)

_EXPLAIN_MODIFIERS = frozenset({"ANALYZE", "VERBOSE"})
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# What client_message scrubs from any engine text (DataFusion's, Lance's, the object
# store's), whatever its wording: deliberately broad, never used to classify an error.
# A Rust panic: everything from "panicked at" on is the engine's, not the client's.
_PANIC = re.compile(r"(thread '[^']*' )?panicked at .*", re.DOTALL)
# Storage URIs, Rust sources (with or without a path) and absolute local paths.
_URI = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{0,15}://[^\s'\"),]*")
_RUST_SOURCE = re.compile(r"[\w./~-]*\.rs:\d+(:\d+)?")
_LOCAL_PATH = re.compile(r"(?<![\w.])(~|\.{1,2})?/[\w.~+-]+(/[\w.~+-]*)+")


def _skip_trivia(sql: str, pos: int) -> int:
    """Skip whitespace, comments and opening parentheses from ``pos``."""
    n = len(sql)
    while pos < n:
        ch = sql[pos]
        if ch.isspace() or ch == "(":
            pos += 1
        elif sql.startswith("--", pos):
            end = sql.find("\n", pos)
            pos = n if end < 0 else end + 1
        elif sql.startswith("/*", pos):
            end = sql.find("*/", pos + 2)
            pos = n if end < 0 else end + 2
        else:
            break
    return pos


def _words(sql: str) -> list[str]:
    """The first few keywords of a statement, upper-cased."""
    words: list[str] = []
    pos = 0
    while len(words) < 4:
        pos = _skip_trivia(sql, pos)
        match = _WORD.match(sql, pos)
        if match is None:
            break
        words.append(match.group(0).upper())
        pos = match.end()
    return words


def leading_keyword(sql: str) -> str:
    """The statement's verb: its first keyword, looking through ``EXPLAIN [ANALYZE] [VERBOSE]``."""
    words = _words(sql)
    if words and words[0] == "EXPLAIN":
        rest = words[1:]
        while rest and rest[0] in _EXPLAIN_MODIFIERS:
            rest = rest[1:]
        return rest[0] if rest else "EXPLAIN"
    return words[0] if words else ""


def reject_writes(sql: str) -> None:
    """Raise :class:`ReadOnlySql` if ``sql`` is not a query. No I/O, no parsing."""
    if leading_keyword(sql) in WRITE_KEYWORDS:
        raise ReadOnlySql()


def client_message(message: str) -> str:
    """``message`` without panic text, Rust sources, storage URIs or local paths."""
    clean = _PANIC.sub("the query engine failed", message)
    clean = _URI.sub("<storage>", clean)
    clean = _RUST_SOURCE.sub("<engine>", clean)
    clean = _LOCAL_PATH.sub("<path>", clean)
    return clean.strip() or "the query failed"


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is DataFusion's memory pool refusing an operator more memory."""
    return not isinstance(exc, LakeError) and messages.out_of_memory(str(exc))


def sql_error(exc: BaseException) -> LakeError:
    """The Lake error for an exception raised while planning or running SQL."""
    if isinstance(exc, LakeError):
        return exc
    if isinstance(exc, _LAKE_BUGS) and not isinstance(exc, pa.ArrowException):
        # Python's own mistakes are Lake's, never the statement's: not a SqlError
        # carrying "list index out of range" back to the caller.
        log.error("query failed inside Lake", exc_info=exc)
        return Internal("the query failed inside Lake")
    raw = messages.without_prefix(str(exc)).strip() or type(exc).__name__
    if messages.refused(raw):
        return ReadOnlySql()
    if messages.out_of_memory(raw):
        return QueryTooLarge(
            "the query needs more memory than its share of this replica "
            "(LAKE_QUERY_MEMORY_LIMIT_BYTES); narrow it or aggregate first"
        )
    operation = messages.overflowed(raw)
    if operation:
        return IntegerOverflow(f"integer overflow in {operation}")
    message = client_message(raw)
    if message != raw:
        # The raw text names engine internals or storage: for operators only.
        log.warning("query engine error", error=raw[:4000], kind=type(exc).__name__)
    return SqlError(message)
