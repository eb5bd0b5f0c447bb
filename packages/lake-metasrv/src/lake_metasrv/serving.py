"""Serve Metasrv until a signal, then drain its commits within the grace."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from lake_core.flight.server import FlightHandler, FlightServer, UncleanShutdown, serve
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.maintenance import AutoCompactor, CompactionSettings, Maintenance

__all__ = ["IO_THREADS", "serve_and_drain", "use_io_threads"]

log = structlog.get_logger("lake_metasrv.serving")

#: Threads for blocking storage work (Lance writes, fsyncs, SQLite, boto3). A
#: commit's own steps must not queue behind the fragment writes of the
#: appends waiting for it, so this is well above the core count.
IO_THREADS = 32


def use_io_threads() -> None:
    """Give the running loop's ``to_thread`` calls :data:`IO_THREADS` threads."""
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(IO_THREADS, thread_name_prefix="lake-io")
    )


async def serve_and_drain(
    handler: FlightHandler,
    coordinator: CommitCoordinator,
    config: MetaConfig,
    *,
    on_started: Callable[[FlightServer], Any],
    stop: asyncio.Event | None,
) -> bool:
    """Serve until stopped; True when every RPC and commit finished within the grace.

    The background compactor (``LAKE_COMPACTION``) runs while serving.
    """
    clean = True
    settings = CompactionSettings.from_env(os.environ)  # before the listener binds
    compactor = AutoCompactor(
        Maintenance(coordinator, settings), may_write=coordinator.gate.is_open
    )
    compactor.start()
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
    finally:
        # A compaction already running is a commit like any other: drained below.
        await compactor.stop()
    # Commits whose callers hung up still run to completion, within the grace.
    if not await coordinator.drain(config.shutdown_grace_ms / 1000):
        log.error("commits still running after the shutdown grace")
        clean = False
    return clean
