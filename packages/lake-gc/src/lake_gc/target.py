"""What one GC run works on: the registry roots, the sidecars and the managed stage.

Chosen from the same configuration the servers read, parsed before any I/O:

- cloud (``LAKE_CLOUD_MODE=true``): the DynamoDB registry table
  (``LAKE_DYNAMODB_TABLE``), the sidecars under ``LAKE_TABLE_PREFIX`` in
  ``LAKE_S3_BUCKET``, and the S3 managed stage (``LAKE_MANAGED_OBJECT_PREFIX``),
  with the standard AWS credential chain and ``AWS_ENDPOINT_URL_*``;
- local: ``<data-dir>/registry.sqlite3``, ``<data-dir>/sidecars`` and the
  stage Metasrv uses (``LAKE_MANAGED_OBJECT_ROOT``, ``LAKE_S3_BUCKET``, or
  ``<data-dir>/objects``).

GC starts neither Query nor Metasrv.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lake_core.cloud import CloudSettings
from lake_core.config import S3_BUCKET
from lake_core.errors import ConfigError
from lake_gc.lineage import LocalSidecars, S3Sidecars, SidecarSource
from lake_gc.roots import DynamoRoots, RootsSource, SqliteRoots
from lake_gc.stage import LocalStage, ManagedStage, S3Stage
from lake_objects.settings import StageSettings

__all__ = ["GcTarget"]


def _client(service: str, endpoint: str | None, region: str | None) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        config=Config(
            connect_timeout=5,
            read_timeout=30,
            retries={"total_max_attempts": 5, "mode": "standard"},
            max_pool_connections=16,
        ),
    )


@dataclass(frozen=True)
class GcTarget:
    roots: RootsSource
    sidecars: SidecarSource
    stage: ManagedStage

    @classmethod
    def from_env(cls, data_dir: Path, env: Mapping[str, str] | None = None) -> GcTarget:
        source = os.environ if env is None else env
        cloud = CloudSettings.from_env(source)
        stage = StageSettings.from_env(
            source, default_local_root=None if cloud else data_dir / "objects"
        )
        if stage is None:
            raise ConfigError(f"cloud mode needs the S3 managed stage ({S3_BUCKET})")
        s3: Any = None
        if stage.kind == "s3" or cloud is not None:
            endpoint = stage.endpoint_url or (cloud.storage.s3_endpoint if cloud else None)
            s3 = _client("s3", endpoint, stage.region or (cloud.storage.region if cloud else None))
        managed: ManagedStage = (
            LocalStage(stage.root)
            if stage.kind == "local"
            else S3Stage(stage.bucket, stage.prefix, s3)
        )
        if cloud is not None:
            dynamodb = _client("dynamodb", cloud.storage.dynamodb_endpoint, cloud.storage.region)
            return cls(
                DynamoRoots(cloud.registry_table, dynamodb),
                S3Sidecars(cloud.bucket, cloud.sidecar_prefix, s3),
                managed,
            )
        return cls(
            SqliteRoots(data_dir / "registry.sqlite3"),
            LocalSidecars(data_dir / "sidecars"),
            managed,
        )
