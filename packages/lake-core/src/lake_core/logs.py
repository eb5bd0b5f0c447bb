"""Server logging: one structured event per line, for structlog and stdlib loggers alike.

``--log-format`` (the servers' option) or ``LAKE_LOG_FORMAT`` picks the
rendering: ``json`` makes every line the process writes to stdout and
stderr one JSON object (the readiness banner and stray prints included),
``console`` is for people. Unset, a process whose stderr is a terminal logs
readable console lines, and anywhere else (a pipe, a file, a container log)
JSON records; both with a plain ``lake ... listening on ADDR`` banner line,
which scripts wait for. ``LAKE_LOG_LEVEL`` sets the level.

Every record carries the RPC's ``request_id`` and, inside a traced call, the
``trace_id`` and ``span_id``. Two processors keep secrets and workload data
out: :func:`redact` masks credentials, presigned URLs and ticket bytes
wherever they appear, and SQL text (``sql``/``query`` keys) is kept at
DEBUG only.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import click
import structlog

from lake_core.config import LOG_FORMAT, LOG_LEVEL
from lake_core.errors import ConfigError

__all__ = [
    "LogFormat",
    "banner",
    "configure_logging",
    "log_format_option",
    "log_settings",
    "redact",
]

LogFormat = Literal["json", "console", "default"]
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS |= {"error": logging.ERROR}
#: Keys whose values are always secret, whatever they hold.
SECRET_KEYS = frozenset(
    {"token", "authorization", "password", "secret", "credential", "credentials", "ticket"}
)
#: Keys that carry SQL text: dropped from records above DEBUG.
SQL_KEYS = frozenset({"sql", "query", "statement"})
_SECRET_PATTERNS = (
    re.compile(r"(?i)bearer\s+[^\s'\",]+"),
    re.compile(r"\blk_[A-Za-z0-9_\-]{8,}"),
    # Presigned URLs: the whole query string goes (signature, credential, token).
    re.compile(r"(?i)(https?://[^\s'\"?]+)\?[^\s'\"]*(?:x-amz-|signature=|sig=)[^\s'\"]*"),
    re.compile(r"(?i)(aws_secret_access_key|aws_session_token)\s*[=:]\s*[^\s'\",]+"),
)
#: Every text one of the patterns above can match holds one of these (case aside):
#: most log values hold none, and one search spares them the four substitutions.
_SECRET_HINT = re.compile(r"(?i)bearer|lk_|\?|aws_")
_state: dict[str, Any] = {"format": "default"}

#: ``--log-format`` of a server command: overrides ``LAKE_LOG_FORMAT``.
log_format_option = click.option(
    "--log-format",
    "log_format",
    type=click.Choice(["json", "console"]),
    default=None,
    help="json: one JSON object per line; console: lines for people. "
    "Default: LAKE_LOG_FORMAT, else console on a terminal and json elsewhere.",
)


def log_settings(
    env: Mapping[str, str] = os.environ, default_level: int = logging.INFO
) -> tuple[LogFormat, int]:
    """``(format, level)`` from ``LAKE_LOG_FORMAT``/``LAKE_LOG_LEVEL``, or ConfigError."""
    raw_format = env.get(LOG_FORMAT, "").strip().lower()
    if raw_format not in ("", "json", "console"):
        raise ConfigError(f"{LOG_FORMAT} must be json or console, got {raw_format!r}")
    raw_level = env.get(LOG_LEVEL, "").strip().lower()
    if raw_level and raw_level not in _LEVELS:
        raise ConfigError(f"{LOG_LEVEL} must be one of {', '.join(_LEVELS)}, got {raw_level!r}")
    fmt: LogFormat = raw_format if raw_format else "default"  # type: ignore[assignment]
    return fmt, _LEVELS[raw_level] if raw_level else default_level


def _substitute(text: str) -> str:
    """Every secret pattern masked in ``text``: the rule ``_scrub`` applies."""
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) + "?***") if m.lastindex else "***", text)
    return text


def _scrub(text: str) -> str:
    if _SECRET_HINT.search(text) is None:
        return text
    return _substitute(text)


def redact(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: mask secrets in every value, drop SQL above DEBUG."""
    debug = event.get("level") == "debug" or method == "debug"
    for key in list(event):
        value = event[key]
        if key.lower() in SECRET_KEYS and value is not None:
            event[key] = "***"
        elif key in SQL_KEYS and not debug and key != "event":
            del event[key]
        elif isinstance(value, str | bytes):
            event[key] = _scrub(
                value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            )
    return event


def add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the current span's trace and span ids, when there is one."""
    from lake_core.telemetry.propagation import current_ids

    ids = current_ids()
    if ids is not None:
        event.setdefault("trace_id", ids[0])
        event.setdefault("span_id", ids[1])
    return event


class _JsonLines(io.TextIOBase):
    """A text stream that turns each non-JSON line written to it into a JSON record."""

    def __init__(self, target: TextIO, stream: str) -> None:
        self._target = target
        self._stream = stream
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def _emit(self, line: str) -> None:
        if not line.strip():
            return
        if line.startswith("{") and line.endswith("}"):
            self._target.write(line + "\n")
            return
        # Stray stderr output is usually a problem report: keep it visible above info.
        level = "warning" if self._stream == "stderr" else "info"
        record = {"event": _scrub(line), "level": level, "logger": self._stream}
        record["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        self._target.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        if self._pending:
            line, self._pending = self._pending, ""
            self._emit(line)
        self._target.flush()

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return False


def configure_logging(
    level: int = logging.INFO,
    env: Mapping[str, str] = os.environ,
    *,
    log_format: str | None = None,
) -> LogFormat:
    """Route structlog and stdlib logging to one handler on stderr; return the format.

    ``LAKE_LOG_LEVEL`` overrides ``level``; a bad value is a ConfigError.
    ``log_format`` (``--log-format``) overrides ``LAKE_LOG_FORMAT``.
    """
    fmt, level = log_settings(env, level)
    if log_format is not None:
        fmt, _ = log_settings({LOG_FORMAT: log_format})
    _state["format"] = fmt
    stderr: TextIO = sys.__stderr__ or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_ids,
        redact,
    ]
    structlog.configure(
        # A record below the level is dropped first, before any processor runs.
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    readable = fmt == "console" or (fmt == "default" and _is_terminal(stderr))
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if readable
        else structlog.processors.JSONRenderer()
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    if fmt == "json":
        # Prints, warnings and tracebacks become records too; JSON lines pass through.
        if not isinstance(sys.stdout, _JsonLines):
            sys.stdout = _JsonLines(sys.__stdout__ or sys.stdout, "stdout")
        if not isinstance(sys.stderr, _JsonLines):
            sys.stderr = _JsonLines(stderr, "stderr")
        logging.captureWarnings(True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    return fmt


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def banner(message: str) -> None:
    """The readiness line (``lake query listening on ADDR``): a record in json format."""
    if _state["format"] == "default":
        print(message, file=sys.stderr, flush=True)
    else:
        structlog.get_logger("lake").info(message)
        sys.stderr.flush()
