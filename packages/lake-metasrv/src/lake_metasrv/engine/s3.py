"""Lance datasets on S3, with Lance's commit pointer in DynamoDB.

A table at ``s3://bucket/prefix/ns/t.lance`` is opened by Lance as
``s3+ddb://bucket/prefix/ns/t.lance?ddbTableName=<manifest table>``: Lance
writes each manifest to S3 and claims its version number with a conditional
put in the manifest table, so version numbers cannot be taken twice.

Appends use :class:`LanceEngine`'s compare-and-swap on the Lance version
(pre-written fragments committed at ``read_version = registered``, kept only
at exactly ``registered + 1``, else the registered version is restored
first); here every commit also claims its version number in DynamoDB, so a
second writer cannot take it. Nothing needs an fsync: S3 acknowledges a
write once it is durable.

I/O failures (S3 or DynamoDB unreachable, timeouts) become
:class:`~lake_core.errors.Unavailable`: every request is bounded by
``LAKE_STORAGE_TIMEOUT_MS``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import structlog

from lake_core.cloud import DatasetStorage, split_s3_uri
from lake_core.errors import Internal, InvalidSchema, Unavailable
from lake_core.models import incarnation_metadata
from lake_core.names import TableRef
from lake_core.storage_probe import StorageProbe
from lake_metasrv.boto_errors import is_boto_outage
from lake_metasrv.config import DEFAULT_RETAIN_MIN_AGE_SECS
from lake_metasrv.engine.base import LanceEngine, WrittenFiles, reclaim_old_versions

__all__ = ["MANIFEST_TABLE_SCHEMA", "NothingToSync", "S3LanceEngine"]

log = structlog.get_logger("lake_metasrv.s3engine")

#: The key schema Lance's DynamoDB manifest store expects.
MANIFEST_TABLE_SCHEMA = {
    "AttributeDefinitions": [
        {"AttributeName": "base_uri", "AttributeType": "S"},
        {"AttributeName": "version", "AttributeType": "N"},
    ],
    "KeySchema": [
        {"AttributeName": "base_uri", "KeyType": "HASH"},
        {"AttributeName": "version", "KeyType": "RANGE"},
    ],
}
#: Retention runs once this many versions accumulated since the last run.
CLEANUP_EVERY = 16
#: Connections each boto3 client keeps: one per worker thread that may use it.
CLIENT_POOL = 32


def _outage(location: str, exc: BaseException) -> Unavailable:
    log.warning("storage unreachable", location=location, error=str(exc)[:300])
    return Unavailable(f"object storage for {location} is unreachable; retry")


class NothingToSync(WrittenFiles):
    """Object stores make a write durable before acknowledging it."""

    def before_commits(self) -> None:
        pass

    def sync_data(self, fragments: Iterable[Any]) -> None:
        pass

    def sync_commits(self, fragments: Iterable[Any] = ()) -> None:
        pass


class S3LanceEngine(LanceEngine):
    """:class:`LanceEngine` for ``s3://`` locations (see the module docstring).

    ``table_location`` names a new table's ``s3://`` location (Metasrv passes
    :meth:`lake_core.cloud.CloudSettings.table_location`).
    """

    def __init__(
        self,
        retain_versions: int,
        storage: DatasetStorage,
        *,
        retain_min_age_secs: int = DEFAULT_RETAIN_MIN_AGE_SECS,
        cleanup_every: int = CLEANUP_EVERY,
        fence: Callable[[], object] | None = None,
        table_location: Callable[[TableRef], str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            retain_versions,
            retain_min_age_secs=retain_min_age_secs,
            cleanup_every=cleanup_every,
            fence=fence,
            clock=clock,
        )
        self.storage = storage
        self._table_location = table_location
        self._clients: dict[str, Any] = {}
        self._clients_lock = threading.Lock()
        self.probe = StorageProbe(storage)

    # -- plumbing -------------------------------------------------------------------

    def location(self, table: TableRef) -> str:
        if self._table_location is None:
            raise Internal("this S3 engine was built without a table location scheme")
        return self._table_location(table)

    def uri(self, location: str) -> str:
        if not location.startswith("s3://"):
            raise Internal(f"the S3 engine cannot hold {location[:200]!r}")
        return self.storage.lance_uri(location)

    def storage_options(self, location: str) -> dict[str, str] | None:
        return self.storage.storage_options(location)

    def local_path(self, location: str) -> Path | None:
        return None  # S3 acknowledges a put once it is durable

    def client(self, service: str) -> Any:
        with self._clients_lock:
            client = self._clients.get(service)
            if client is None:
                import boto3
                from botocore.config import Config

                timeout = max(1.0, self.storage.timeout_ms / 1000)
                endpoint = (
                    self.storage.s3_endpoint if service == "s3" else self.storage.dynamodb_endpoint
                )
                client = boto3.session.Session().client(
                    service,  # type: ignore[call-overload]
                    endpoint_url=endpoint,
                    region_name=self.storage.region,
                    config=Config(
                        connect_timeout=min(timeout, 3.0),
                        read_timeout=timeout,
                        # Two attempts in all: an outage surfaces within ~2 timeouts.
                        retries={"total_max_attempts": 2, "mode": "standard"},
                        s3={"addressing_style": "path"},
                        # Shared by every table's sidecar and digest writers
                        # (worker threads); botocore's default of 10 would make
                        # tables committing at once open and drop connections.
                        max_pool_connections=CLIENT_POOL,
                    ),
                )
                self._clients[service] = client
            return client

    def storage_error(self, location: str, exc: BaseException) -> BaseException:
        return _outage(location, exc) if self.is_outage(location, exc) else exc

    def is_outage(self, location: str, exc: BaseException) -> bool:
        """Whether ``exc`` came from S3 or DynamoDB being out of reach, decided by types.

        A boto error says so by its type or code; a Lance error says nothing
        but text, so the stores are asked instead (only on this failure path).
        """
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, BotoCoreError | ClientError):
            return is_boto_outage(exc)
        return not self._stores_reachable(location)

    def _stores_reachable(self, location: str) -> bool:
        if not self.probe.reachable(location):
            return False
        try:
            self.client("dynamodb").describe_table(TableName=self.storage.manifest_table)
        except Exception as exc:
            return not is_boto_outage(exc)
        return True

    def written_files(self, location: str) -> WrittenFiles:
        return NothingToSync()

    # -- create / drop --------------------------------------------------------------

    async def create(self, location: str, schema: pa.Schema, incarnation: str) -> int:
        return await asyncio.to_thread(self._create, location, schema, incarnation)

    def _create(self, location: str, schema: pa.Schema, incarnation: str) -> int:
        self.fence()
        self._purge(location, leftovers=True)
        owned = schema.with_metadata(incarnation_metadata(incarnation))
        try:
            dataset = lance.write_dataset(
                owned.empty_table(),
                self.uri(location),
                schema=owned,
                mode="create",
                storage_options=self.storage_options(location),
            )
        except (ValueError, OSError, NotImplementedError, pa.ArrowException) as exc:
            if self.is_outage(location, exc):
                raise _outage(location, exc) from None
            raise InvalidSchema(f"Lance cannot store this schema: {exc}") from None
        self._datasets[location] = (incarnation, dataset)
        return int(dataset.version)

    async def remove(self, location: str) -> None:
        """Best effort, like the local engine: a leftover is purged by the next create."""
        try:
            await asyncio.to_thread(self._purge, location, False)
        except Exception as exc:
            log.warning("could not delete a dropped dataset", location=location, error=str(exc))

    def _purge(self, location: str, leftovers: bool) -> None:
        """Delete a dataset's objects and its manifest rows (a dropped or crashed table)."""
        self._datasets.pop(location, None)
        self._since_cleanup.pop(location, None)
        bucket, key = split_s3_uri(location)
        prefix = key.rstrip("/") + "/"
        try:
            s3 = self.client("s3")
            deleted = 0
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
                    deleted += len(keys)
            rows = self._manifest_rows(location)
            self._delete_manifest_rows(location, rows)
        except Exception as exc:
            if is_boto_outage(exc):
                raise _outage(location, exc) from None
            raise
        if leftovers and (deleted or rows):
            log.warning(
                "removed an unregistered dataset left by a crash",
                location=location,
                objects=deleted,
                manifests=len(rows),
            )

    def _manifest_rows(self, location: str) -> list[int]:
        ddb = self.client("dynamodb")
        base = self.storage.manifest_base_uri(location)
        versions: list[int] = []
        kwargs: dict[str, Any] = {
            "TableName": self.storage.manifest_table,
            "KeyConditionExpression": "base_uri = :b",
            "ExpressionAttributeValues": {":b": {"S": base}},
            "ProjectionExpression": "version",
            "ConsistentRead": True,
        }
        while True:
            reply = ddb.query(**kwargs)
            versions.extend(int(item["version"]["N"]) for item in reply.get("Items", []))
            if not reply.get("LastEvaluatedKey"):
                return versions
            kwargs["ExclusiveStartKey"] = reply["LastEvaluatedKey"]

    def _delete_manifest_rows(self, location: str, versions: list[int]) -> None:
        ddb = self.client("dynamodb")
        base = self.storage.manifest_base_uri(location)
        for start in range(0, len(versions), 25):
            requests = [
                {"DeleteRequest": {"Key": {"base_uri": {"S": base}, "version": {"N": str(v)}}}}
                for v in versions[start : start + 25]
            ]
            for _ in range(10):
                reply = ddb.batch_write_item(RequestItems={self.storage.manifest_table: requests})
                requests = reply.get("UnprocessedItems", {}).get(self.storage.manifest_table, [])
                if not requests:
                    break
                time.sleep(0.05)

    # -- reads and retention ------------------------------------------------------------

    async def read(self, location: str, engine_version: int) -> pa.Table:
        def read() -> pa.Table:
            try:
                dataset = lance.dataset(
                    self.uri(location),
                    version=engine_version,
                    storage_options=self.storage_options(location),
                )
            except (ValueError, OSError) as exc:
                raise self.read_failure(location, engine_version, exc) from None
            return dataset.to_table()

        return await asyncio.to_thread(read)

    def cleanup_now(self, location: str, registered_version: int) -> int:
        """Reclaim the versions outside both windows (count and age), never tagged ones.

        Manifest rows in DynamoDB are deleted only for versions Lance itself
        no longer lists after its cleanup (never the latest).
        """
        options = self.storage_options(location)
        uri = self.uri(location)
        dataset = lance.dataset(uri, storage_options=options)
        removed = reclaim_old_versions(
            dataset,
            location,
            registered_version,
            self.retain_versions,
            min_age_secs=self.retain_min_age_secs,
            now=self.clock(),
        )
        if removed is None:
            return 0
        kept = {int(v["version"]) for v in lance.dataset(uri, storage_options=options).versions()}
        obsolete = [
            v for v in self._manifest_rows(location) if v < registered_version and v not in kept
        ]
        self._delete_manifest_rows(location, obsolete)
        return removed
