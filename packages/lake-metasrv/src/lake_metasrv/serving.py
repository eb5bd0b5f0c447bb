"""Serve Metasrv until a signal, then drain its commits within the grace."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from lake_core.flight.server import FlightHandler, FlightServer, UncleanShutdown, serve
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig

__all__ = ["serve_and_drain"]

log = structlog.get_logger("lake_metasrv.serving")


async def serve_and_drain(
    handler: FlightHandler,
    coordinator: CommitCoordinator,
    config: MetaConfig,
    *,
    on_started: Callable[[FlightServer], Any],
    stop: asyncio.Event | None,
) -> bool:
    """Serve until stopped; True when every RPC and commit finished within the grace."""
    clean = True
    try:
        await serve(
            handler,
            config.addr,
            authenticate=config.security.authenticator,
            tls=config.security.tls_pair,
            grace_ms=config.shutdown_grace_ms,
            on_started=on_started,
            stop=stop,
        )
    except UncleanShutdown as exc:
        log.error("shutdown grace exceeded", error=str(exc))
        clean = False
    # Commits whose callers hung up still run to completion, within the grace.
    if not await coordinator.drain(config.shutdown_grace_ms / 1000):
        log.error("commits still running after the shutdown grace")
        clean = False
    return clean
