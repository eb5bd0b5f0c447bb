"""Metasrv in cloud mode: tables and sidecars on S3, registry and lease in DynamoDB.

Every node serves reads (describe, catalog snapshots) straight from the
registry table. Exactly one node, the lease holder, commits; the others
forward writes to it (:mod:`lake_metasrv.forwarding`). Shutdown keeps the
lease while accepted writes drain, then resigns it at once so a standby takes
over without waiting out the TTL.

    s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/<ns>/<table>.lance        datasets
    s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/_lake-sidecars/<inc>/...   sidecars
    $LAKE_DYNAMODB_TABLE                                               registry + lease
    $LAKE_MANIFEST_DYNAMODB_TABLE                                      Lance manifests
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from pydantic import BaseModel

from lake_core.errors import Internal, Unavailable
from lake_core.flight.server import FlightServer
from lake_core.integrity import DataFileReader
from lake_core.logs import banner
from lake_core.references import (
    DROPPED_NAME,
    MAINTENANCE_KEY_PREFIX,
    DropMarker,
    ReferenceDelta,
    s3_sidecar_key,
)
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.engine import LanceEngine
from lake_metasrv.forwarding import ForwardingMetaHandler, PeerClients
from lake_metasrv.gate import LeadershipGate
from lake_metasrv.integrity import DigestStore
from lake_metasrv.lease import Leadership
from lake_metasrv.registry.dynamo import DynamoRegistry, dynamo_client_config, ensure_table
from lake_metasrv.s3engine import MANIFEST_TABLE_SCHEMA, S3LanceEngine
from lake_metasrv.serving import serve_and_drain, use_io_threads
from lake_metasrv.sidecars import SidecarStore

__all__ = ["S3DigestStore", "S3SidecarStore", "run_cloud_server"]

log = structlog.get_logger("lake_metasrv.cloud")


class S3SidecarStore(SidecarStore):
    """Reference-delta sidecars as S3 objects, one per version *and* operation (cloud mode).

    ``<prefix>/<incarnation>/<version:020d>/<operation-id or create>.json``
    (a maintenance commit's empty delta: ``maintenance-<engine_version:020d>.json``):
    a retry of a version after a crash, or a fenced old leader writing late,
    adds another object instead of replacing one, so GC's live set can only
    grow (a sidecar for a version never registered keeps more, never fewer).
    """

    def __init__(self, bucket: str, prefix: str, client: Callable[[], Any]) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client = client

    def key(
        self,
        incarnation: str,
        version: int,
        operation_id: str | None,
        engine_version: int | None = None,
    ) -> str:
        return s3_sidecar_key(self.prefix, incarnation, version, operation_id, engine_version)

    def write_delta(self, delta: ReferenceDelta) -> str:
        key = self.key(delta.incarnation, delta.version, delta.operation_id, delta.engine_version)
        return self._put(key, delta)

    def write_deltas(self, deltas: Sequence[ReferenceDelta]) -> None:
        """Put a group's sidecars concurrently; returns once every one is stored."""
        if len(deltas) == 1:
            self.write_delta(deltas[0])
            return
        with ThreadPoolExecutor(max_workers=min(8, len(deltas))) as pool:
            for _ in pool.map(self.write_delta, deltas):
                pass

    def write_drop(self, marker: DropMarker) -> str:
        key = f"{self.prefix}/{marker.incarnation}/{DROPPED_NAME}"
        try:
            return self._put(key, marker)
        except Exception as exc:
            # The drop already happened; without its marker GC only keeps more.
            log.warning("could not write a drop marker", key=key, error=str(exc))
            return f"s3://{self.bucket}/{key}"

    def read_delta(
        self, incarnation: str, version: int, operation_id: str | None = None
    ) -> ReferenceDelta:
        client = self._client()
        if operation_id is None:
            listing = client.list_objects_v2(
                Bucket=self.bucket, Prefix=f"{self.prefix}/{incarnation}/{version:020d}/"
            )
            # The version's own delta; maintenance deltas beside it are empty.
            keys = [
                o["Key"]
                for o in listing.get("Contents", [])
                if not o["Key"].rsplit("/", 1)[1].startswith(MAINTENANCE_KEY_PREFIX)
            ]
            if len(keys) != 1:
                raise Internal(f"{len(keys)} sidecars for {incarnation} version {version}")
            key = keys[0]
        else:
            key = self.key(incarnation, version, operation_id)
        body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return ReferenceDelta.model_validate_json(body)

    def _put(self, key: str, model: BaseModel) -> str:
        data = json.dumps(model.model_dump(mode="json"), sort_keys=True).encode()
        try:
            self._client().put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType="application/json"
            )
        except Exception as exc:
            raise _s3_error(exc, f"s3://{self.bucket}/{key}") from None
        return f"s3://{self.bucket}/{key}"


class S3DigestStore(DigestStore):
    """Digest records of S3 tables, one object each (a put is durable once acknowledged)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: Callable[[], Any],
        engine: LanceEngine,
        files: DataFileReader,
    ) -> None:
        super().__init__(engine, files)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client = client

    def _key(self, incarnation: str, name: str = "") -> str:
        return f"{self.prefix}/{incarnation}/{name}"

    def _put(self, incarnation: str, records: Sequence[tuple[str, bytes]]) -> None:
        client = self._client()
        for name, body in records:
            key = self._key(incarnation, name)
            try:
                client.put_object(
                    Bucket=self.bucket, Key=key, Body=body, ContentType="application/json"
                )
            except Exception as exc:
                raise _s3_error(exc, f"s3://{self.bucket}/{key}") from None

    def _listing(self, incarnation: str) -> dict[str, str]:
        prefix = self._key(incarnation)
        try:
            listing: dict[str, str] = {}
            pages = (
                self._client()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=self.bucket, Prefix=prefix)
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    if item["Key"].endswith(".json"):
                        name = item["Key"].removeprefix(prefix)
                        listing[name] = f"{item.get('ETag', '')}:{item.get('Size', 0)}"
            return listing
        except Exception as exc:
            raise _s3_error(exc, f"s3://{self.bucket}/{prefix}") from None

    def _read(self, incarnation: str, names: Sequence[str]) -> list[bytes]:
        try:
            return self._read_keys([self._key(incarnation, name) for name in names])
        except Exception as exc:
            raise _s3_error(exc, f"s3://{self.bucket}/{self._key(incarnation)}") from None

    def _read_keys(self, keys: list[str]) -> list[bytes]:
        client = self._client()

        def read(key: str) -> bytes:
            return bytes(client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

        if len(keys) <= 1:
            return [read(k) for k in keys]
        with ThreadPoolExecutor(min(8, len(keys))) as pool:
            return list(pool.map(read, keys))


def _s3_error(exc: BaseException, uri: str) -> Exception:
    """UNAVAILABLE for S3 being unreachable or overloaded; INTERNAL for anything else."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if status >= 500 or exc.response.get("Error", {}).get("Code") == "SlowDown":
            return Unavailable(f"S3 is unavailable for {uri}; retry")
        return Internal(f"S3 refused a write to {uri}: {exc.response.get('Error', {}).get('Code')}")
    if isinstance(exc, BotoCoreError | OSError):
        log.warning("S3 unreachable", uri=uri, error=repr(exc)[:300])
        return Unavailable(f"S3 is unreachable for {uri}; retry")
    return exc if isinstance(exc, Exception) else Internal(str(exc))


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
