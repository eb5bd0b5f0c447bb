"""``lake query``: run one Query replica.

Startup order: parse and validate the whole configuration, ask Metasrv
for the first catalog snapshot, then bind. Metasrv not reachable yet (the
two started at once, a restart, a failover) does not stop the replica: it
binds anyway, reports NOT_SERVING on gRPC Health and refuses statements
with UNAVAILABLE (:mod:`lake_query.serving.readiness`) until the snapshot arrives,
retried every quarter second at most.
Logs are structlog JSON lines on stderr; once serving, the process prints
``lake query listening on ADDR`` to stderr. The native data plane
(``LAKE_QUERY_DATA_ADDR``) binds just before the main listener and drains
beside it on SIGTERM, within the same grace.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys

import click
import structlog

from lake_core.cli import data_dir_option
from lake_core.errors import LakeError
from lake_core.flight.server import FlightServer, UncleanShutdown, serve, shutdown_grace_ms
from lake_core.integrity import DataFileReader
from lake_core.logs import banner, configure_logging, log_format_option
from lake_core.metaclient import MetaClient
from lake_core.startup import run_process
from lake_core.tickets import TicketSealer
from lake_query.config import DEFAULT_ADDR, DEFAULT_METADATA_ADDR, QueryConfig
from lake_query.dataplane.server import DataPlane
from lake_query.flightsql import QueryHandler
from lake_query.flightsql.stage import QueryStage
from lake_query.jobs import AsyncQueries, JobSeal, open_stores
from lake_query.jobs.model import RETENTION_SECS
from lake_query.planning import DatasetOpener, PinnedDatasets
from lake_query.planning.catalog_cache import FIRST_LOAD_BACKOFF_S, CatalogCache
from lake_query.planning.scan_cache import ScanCache
from lake_query.planning.verify import DataFileVerifier, MetaDigests
from lake_query.planning.verify_ahead import VerifyAhead
from lake_query.planning.version_starts import MetaVersionStarts
from lake_query.serving.admission import Admission
from lake_query.serving.health import watch_health
from lake_query.serving.memory import collect_cycles, tune_allocator
from lake_query.serving.planning_threads import PlanningThreads
from lake_query.serving.readiness import CATALOG, Readiness, follow_health

__all__ = ["configure_logging", "main", "query", "run"]

log = structlog.get_logger("lake_query")

#: Prepared-statement handles live longer than result tickets: ADBC keeps
#: them for the life of a cursor.
HANDLE_TTL_SECS = 3600


async def run(config: QueryConfig, stop: asyncio.Event | None = None) -> None:
    """Connect the catalog, then serve until SIGINT/SIGTERM (or ``stop``)."""
    collector = asyncio.get_running_loop().create_task(collect_cycles())
    meta = MetaClient(
        config.metadata_addr,
        token=config.metadata_token,
        ca_pem=config.metadata_tls.ca_pem,
        server_name=config.metadata_tls.server_name,
        # Metasrv (re)starting: reconnect as soon as the catalog retries, not a second later.
        max_reconnect_backoff_ms=int(FIRST_LOAD_BACKOFF_S[1] * 1000),
    )
    # Always built: a failed scan asks it whether a data file changed since its commit.
    verifier = DataFileVerifier(
        MetaDigests(meta, asyncio.get_running_loop()), reader=DataFileReader(config.storage)
    )
    cache = CatalogCache(meta, config.catalog_refresh_s)
    stage = QueryStage(config.stage)
    handler: QueryHandler | None = None
    stores = None
    plane: DataPlane | None = None
    drained: asyncio.Task[int] | None = None
    ahead: VerifyAhead | None = None
    stop = stop if stop is not None else asyncio.Event()
    try:
        # Bounded external checks (Iceberg namespaces) before the listener binds.
        for catalog in config.external:
            await asyncio.to_thread(catalog.start)
        if config.async_queries is not None:
            stores = await open_stores(config.async_queries)
        readiness = Readiness()
        readiness.block(
            CATALOG,
            f"this Query replica has no catalog yet: the metadata service at "
            f"{config.metadata_addr} has not answered since it started; retry shortly",
        )
        cache.on_loaded(lambda: readiness.clear(CATALOG))
        await cache.start()
        if cache.loaded:
            log.info(
                "catalog connected",
                metadata_addr=config.metadata_addr,
                generation=cache.generation,
                tables=len(cache.tables()),
            )
        tickets = TicketSealer(config.ticket_ring, config.audience, config.ticket_ttl_secs)

        def async_queries(built: QueryHandler) -> AsyncQueries:
            assert config.async_queries is not None
            assert stores is not None
            ring = config.ticket_ring
            seal = JobSeal(
                TicketSealer(ring, f"{config.audience}/async-job", RETENTION_SECS),
                TicketSealer(ring, f"{config.audience}/async-handle", RETENTION_SECS),
                ring,
            )
            return AsyncQueries(
                config.async_queries,
                *stores,
                seal=seal,
                tickets=tickets,
                # Interruptible: a cancelled job frees its slot mid-batch.
                execute=functools.partial(built.planner.execute, abortable=True),
            )

        admission = Admission(config.admission)
        datasets = DatasetOpener(
            config.storage,
            PinnedDatasets(),
            verifier=verifier,
            verify_on_open=config.verify_on_open,
        )
        if config.verify_on_open:
            # New versions of tables this replica reads are verified before a query asks.
            ahead = VerifyAhead(datasets)
            cache.on_version(ahead.offer)
            ahead.start()
        handler = QueryHandler(
            cache=cache,
            sealer=tickets,
            handle_sealer=TicketSealer(
                config.ticket_ring, f"{config.audience}/prepared", HANDLE_TTL_SECS
            ),
            appends=meta,
            admission=admission,
            planning=PlanningThreads(config.planning),
            max_sql_bytes=config.admission.max_sql_bytes,
            stage=stage,
            datasets=datasets,
            limits=config.limits,
            partitions=config.partitions,
            external=config.external,
            async_queries=None if stores is None else async_queries,
            readiness=readiness,
            scans=ScanCache(config.scan_cache_bytes) if config.scan_cache_bytes else None,
            walk_start=MetaVersionStarts(meta, asyncio.get_running_loop()),
        )
        if handler.async_queries is not None:
            handler.async_queries.start()
        if config.data_plane is not None:
            plane = DataPlane(
                config.data_plane,
                handler,
                admission,
                config.security,
                asyncio.get_running_loop(),
            )
            handler.data_location = plane.uri
            log.info("data plane serving", addr=config.data_plane.addr, uri=plane.uri)
            drained = asyncio.create_task(_drain_on_stop(plane, stop))

        def started(server: FlightServer) -> None:
            assert handler is not None
            follow_health(readiness, server, asyncio.get_running_loop())
            watch_health(server, handler.planning, readiness)
            log.info(
                "serving",
                addr=config.addr,
                port=server.port,
                tls=config.security.tls is not None,
                authenticator=repr(config.security.authenticator),
                admission=repr(config.admission),
            )
            banner(f"lake query listening on {config.addr}")

        await serve(
            handler,
            config.addr,
            authenticate=config.security.authenticator,
            tls=config.security.tls_pair,
            on_started=started,
            stop=stop,
            serving=lambda: readiness.serving,
        )
        if drained is not None:
            left = await drained
            drained = None
            if left:
                raise UncleanShutdown(left, shutdown_grace_ms())
    finally:
        if drained is not None:  # serve failed: stop the data plane too
            stop.set()
            await drained
        collector.cancel()
        await cache.close()
        if ahead is not None:
            await asyncio.to_thread(ahead.close)
        await meta.close()
        await stage.close()
        if handler is not None:
            if handler.async_queries is not None:
                await handler.async_queries.close()
            handler.close()
        elif stores is not None:
            for store in stores:
                await store.close()
        for catalog in config.external:
            catalog.close()


async def _drain_on_stop(plane: DataPlane, stop: asyncio.Event) -> int:
    """On stop (SIGTERM), drain the data plane beside the main listener, same grace."""
    await stop.wait()
    grace_s = shutdown_grace_ms() / 1000
    left = await asyncio.to_thread(plane.drain, grace_s)
    if left:
        log.error("data plane drain cut off streams", streams=left, grace_s=grace_s)
    return left


@click.command("query")
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, help="Listen address host:port.")
@click.option(
    "--metadata-addr",
    default=DEFAULT_METADATA_ADDR,
    show_default=True,
    help="Metasrv URL (http:// or https://).",
)
@click.option("--log-level", default="info", show_default=True, help="debug, info, warning, error.")
@data_dir_option(
    None, "Metasrv's local data directory: SDKs get the managed stage <data-dir>/objects"
)
@log_format_option
def query(
    addr: str, metadata_addr: str, log_level: str, data_dir: str | None, log_format: str | None
) -> None:
    """Run a Lake Query replica (Flight SQL over DataFusion)."""

    def load() -> QueryConfig:
        tune_allocator()
        return QueryConfig.load(addr, metadata_addr, data_dir=data_dir)

    level = getattr(logging, log_level.upper(), logging.INFO)
    try:
        run_process("lake-query", load=load, serve=run, level=level, log_format=log_format)
    except UncleanShutdown as exc:
        log.error("unclean shutdown", error=str(exc))
        sys.exit(1)
    except LakeError as exc:
        log.error("lake query failed", error=str(exc), error_type=type(exc).__name__)
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        log.error("lake query failed", error=str(exc))
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def main() -> None:
    query.main(prog_name="lake query")
