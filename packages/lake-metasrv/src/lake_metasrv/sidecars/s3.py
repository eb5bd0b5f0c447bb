"""Reference-delta sidecars as S3 objects beside the tables (cloud mode).

``s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/_lake-sidecars/<incarnation>/...``:
one object per version *and* operation, so a retry or a fenced old leader
adds an object instead of replacing one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from pydantic import BaseModel

from lake_core.errors import Internal
from lake_core.references import (
    DROPPED_NAME,
    MAINTENANCE_KEY_PREFIX,
    DropMarker,
    ReferenceDelta,
    s3_sidecar_key,
)
from lake_metasrv.boto_errors import s3_error
from lake_metasrv.sidecars.base import SidecarStore

__all__ = ["S3SidecarStore"]

# The logger these warnings always came from (the cloud module, before the split).
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
            raise s3_error(exc, f"s3://{self.bucket}/{key}") from None
        return f"s3://{self.bucket}/{key}"
