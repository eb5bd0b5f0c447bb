"""Metasrv in cloud mode, wired: tables and sidecars on S3, registry and lease in DynamoDB.

Every node serves reads (describe, catalog snapshots) straight from the
registry table. Exactly one node, the lease holder, commits; the others
forward writes to it (:mod:`lake_metasrv.forwarding`). Shutdown keeps the
lease while accepted writes drain, then resigns it at once so a standby takes
over without waiting out the TTL.

    s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/<ns>/<table>.lance        datasets
    s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/_lake-sidecars/<inc>/...   sidecars
    $LAKE_DYNAMODB_TABLE                                               registry + lease
    $LAKE_MANIFEST_DYNAMODB_TABLE                                      Lance manifests

Only wiring lives here: each seam's S3 implementation sits beside its local
twin (``engine.s3``, ``sidecars.s3``, ``digests.s3``, ``registry.dynamo``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from lake_core.errors import Internal
from lake_core.flight.server import FlightServer
from lake_core.integrity import DataFileReader
from lake_core.logs import banner
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.digests.s3 import S3DigestStore
from lake_metasrv.engine.s3 import MANIFEST_TABLE_SCHEMA, S3LanceEngine
from lake_metasrv.forwarding import ForwardingMetaHandler, PeerClients
from lake_metasrv.gate import LeadershipGate
from lake_metasrv.lease import Leadership
from lake_metasrv.registry.dynamo import DynamoRegistry, dynamo_client_config, ensure_table
from lake_metasrv.serving import serve_and_drain, use_io_threads
from lake_metasrv.sidecars.s3 import S3SidecarStore

__all__ = ["run_cloud_server"]

log = structlog.get_logger("lake_metasrv.cloud")


def _advertised(config: MetaConfig, server: FlightServer) -> str:
    if config.advertise_url:
        return config.advertise_url
    host = config.addr.rpartition(":")[0]
    scheme = "https" if config.security.tls is not None else "http"
    return f"{scheme}://{host}:{server.port}"


async def run_cloud_server(
    config: MetaConfig,
    *,
    stop: asyncio.Event | None = None,
    on_started: Callable[[FlightServer], object] | None = None,
) -> int:
    """Serve one cloud Metasrv node until SIGINT/SIGTERM or ``stop``; return the exit code."""
    import aioboto3

    cloud = config.cloud
    if cloud is None:
        raise Internal("run_cloud_server needs cloud settings")
    use_io_threads()
    session = aioboto3.Session()
    async with session.client(
        "dynamodb",
        endpoint_url=cloud.storage.dynamodb_endpoint,
        region_name=cloud.storage.region,
        config=dynamo_client_config(),
    ) as dynamodb:
        # The URL is known once the listener bound; followers read it from the lease.
        leadership = Leadership(dynamodb, cloud.registry_table, url="", ttl_s=config.lease_ttl_s)
        registry = DynamoRegistry(
            cloud.registry_table,
            client=dynamodb,
            fence=leadership.epoch,
            fault_points=config.faults,
        )
        engine = S3LanceEngine(
            config.retain_versions,
            cloud.storage,
            retain_min_age_secs=config.retain_min_age_secs,
            fence=leadership.epoch,
            table_location=cloud.table_location,
        )
        sidecars = S3SidecarStore(cloud.bucket, cloud.sidecar_prefix, lambda: engine.client("s3"))
        # Nothing changes a table unless this node holds a valid lease: the gate
        # is checked before a change starts, the engine again before Lance
        # commits, and the registry before each write (and fences on the epoch).
        digests = S3DigestStore(
            cloud.bucket,
            cloud.integrity_prefix,
            lambda: engine.client("s3"),
            engine,
            DataFileReader(cloud.storage),
        )
        coordinator = CommitCoordinator(
            config, registry, engine, sidecars, gate=LeadershipGate(leadership), digests=digests
        )
        peers = PeerClients(config.peer_token, config.peer_tls)
        await ensure_table(dynamodb, cloud.storage.manifest_table, **MANIFEST_TABLE_SCHEMA)
        await coordinator.open()

        async def take_over(epoch: int) -> None:
            engine.forget()
            fenced = await registry.take_authority(epoch)
            log.info("took over the registry", epoch=epoch, tables_fenced=fenced)

        leadership.on_elected = take_over
        try:

            def started(server: FlightServer) -> None:
                leadership.url = _advertised(config, server)
                bound = f"{config.addr.rpartition(':')[0]}:{server.port}"
                log.info(
                    "metasrv serving (cloud)",
                    addr=bound,
                    advertise=leadership.url,
                    node=leadership.node,
                    tls=config.security.tls is not None,
                    bucket=cloud.bucket,
                    table_prefix=cloud.table_prefix,
                    registry_table=cloud.registry_table,
                    manifest_table=cloud.storage.manifest_table,
                    lease_ttl_s=config.lease_ttl_s,
                )
                banner(f"lake meta listening on {bound}")
                leadership.start()
                if on_started is not None:
                    on_started(server)

            clean = await serve_and_drain(
                ForwardingMetaHandler(coordinator, leadership, peers),
                coordinator,
                config,
                on_started=started,
                stop=stop,
            )
            return 0 if clean else 1
        finally:
            # Accepted writes are drained (or the grace ran out): hand over at once.
            with contextlib.suppress(Exception):
                await leadership.resign()
            await leadership.close()
            await peers.close()
            await coordinator.close(drain_timeout_s=0.1)
