"""A server process's start-up and end, the same for every Lake server (``lake meta``, ``lake query``).

::

    code = run_process("lake-meta", load=load_config, serve=run_server, log_format=log_format)

In this order: logging is configured (``--log-format``, ``LAKE_LOG_FORMAT``,
``LAKE_LOG_LEVEL``); the telemetry configuration is validated; ``load``
reads and validates the whole configuration; a warning names every armed
fault point (``LAKE_FAULTS``, :mod:`lake_core.faults`); telemetry starts
(``/metrics`` bound, tracing installed) before the listener binds; then
``serve`` runs on a fresh event loop (binding, signal handling and drain are
:func:`lake_core.flight.server.serve`'s). Telemetry is closed however it ends.
Errors propagate unchanged: each command reports them in its own words.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

from lake_core import faults
from lake_core.config import FAULTS
from lake_core.logs import configure_logging
from lake_core.telemetry.process import ProcessTelemetry

__all__ = ["run_process", "warn_if_faults_armed"]

C = TypeVar("C")

log = structlog.get_logger("lake_core.startup")


def warn_if_faults_armed(armed: faults.Faults) -> None:
    """Log a warning naming every armed fault point and setting (none armed: nothing)."""
    if not armed.armed:
        return
    log.warning(
        "test-only fault points are armed: this process crashes, stops or shrinks on purpose",
        variable=str(FAULTS),
        points=sorted(armed.points),
        settings=dict(sorted(armed.settings.items())),
    )


def run_process(
    service: str,
    *,
    load: Callable[[], C],
    serve: Callable[[C], Coroutine[Any, Any, int | None]],
    level: int = logging.INFO,
    log_format: str | None = None,
) -> int:
    """Start ``service`` (its telemetry name), serve until it stops; the exit code.

    ``serve`` returns the code (None: 0).
    """
    telemetry: ProcessTelemetry | None = None
    try:
        configure_logging(level, log_format=log_format)
        telemetry = ProcessTelemetry.load(service)
        config = load()
        warn_if_faults_armed(faults.active())
        telemetry.start()  # before the Flight listener binds
        return asyncio.run(serve(config)) or 0
    finally:
        if telemetry is not None:
            telemetry.close()
