"""Query's part in FILE values: it describes the stage and signs reads, never moves bytes.

- ``lake.managed_stage``: the caller's credential-free child-stage descriptor
  (``tenants/<tenant-id>`` below the configured local root or S3 prefix).
- ``lake.read_capability``: for an S3 stage only, a presigned GET signed with
  Query's own AWS identity, after the DataLocation was checked against the
  caller's tenant prefix. Signing sends no request to storage.
- Appends: every non-null FILE cell must name an object inside the caller's
  tenant prefix; the check runs on the decoded batches before anything is
  forwarded to Metasrv.

Configuration comes from :class:`lake_objects.settings.StageSettings`
(``LAKE_S3_BUCKET``, ``LAKE_MANAGED_OBJECT_PREFIX``, ``LAKE_MANAGED_OBJECT_ROOT``
or ``lake query --data-dir``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from lake_core.filetype import is_file_field
from lake_core.principal import Principal
from lake_core.telemetry import series
from lake_objects.descriptor import ReadCapabilityRequest, ReadCapabilityResult, StageDescriptor
from lake_objects.errors import (
    NO_ISSUER_MESSAGE,
    NO_STAGE_MESSAGE,
    LocationOutsideStage,
    PresignUnsupported,
    StageUnavailable,
)
from lake_objects.reader import check_range
from lake_objects.s3 import presign_get, s3_client
from lake_objects.settings import StageSettings

__all__ = ["QueryStage"]

log = structlog.get_logger("lake_query.stage")


class QueryStage:
    """The managed stage as one Query replica serves it."""

    def __init__(self, settings: StageSettings | None) -> None:
        self.settings = settings
        self._client: Any = None
        self._client_cm: Any = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        kind = self.settings.kind if self.settings else "none"
        return f"QueryStage({kind})"

    @property
    def issues_capabilities(self) -> bool:
        """The read-capability issuer is installed for an S3 stage only."""
        return self.settings is not None and self.settings.kind == "s3"

    def descriptor(self, principal: Principal) -> StageDescriptor:
        if self.settings is None:
            series.STAGE_MINTS.inc(kind="discovery", outcome="failed")
            raise StageUnavailable(
                f"{NO_STAGE_MESSAGE}: set LAKE_S3_BUCKET, "
                "LAKE_MANAGED_OBJECT_ROOT or lake query --data-dir"
            )
        series.STAGE_MINTS.inc(kind="discovery", outcome="ok")
        return self.settings.descriptor(principal.tenant_id)

    async def read_capability(
        self, principal: Principal, request: ReadCapabilityRequest
    ) -> ReadCapabilityResult:
        try:
            result = await self._read_capability(principal, request)
        except BaseException:
            series.STAGE_MINTS.inc(kind="read_capability", outcome="failed")
            raise
        series.STAGE_MINTS.inc(kind="read_capability", outcome="ok")
        return result

    async def _read_capability(
        self, principal: Principal, request: ReadCapabilityRequest
    ) -> ReadCapabilityResult:
        if self.settings is None or not self.issues_capabilities:
            raise PresignUnsupported(NO_ISSUER_MESSAGE)
        scope = self.settings.scope(principal.tenant_id)
        name = scope.check(request.location.uri)
        if request.start is not None or request.end is not None:
            check_range(request.location, request.start or 0, request.end or 0)
        key = f"{self.settings.prefix + '/' if self.settings.prefix else ''}tenants/{principal.tenant_id}/{name}"
        capability = await presign_get(
            await self._signer(), self.settings.bucket, key, request.ttl_secs
        )
        log.info(
            "read capability issued",
            principal=principal.principal_id,
            ttl_secs=request.ttl_secs,
            ranged=request.start is not None,
        )
        return capability.to_result()

    async def _signer(self) -> Any:
        if self._client is None:
            async with self._lock:
                if self._client is None:
                    assert self.settings is not None
                    cm = s3_client(self.settings.endpoint_url, self.settings.region or "us-east-1")
                    self._client = await cm.__aenter__()
                    self._client_cm = cm
        return self._client

    def check_append(
        self, principal: Principal, table_schema: pa.Schema, batches: Iterable[pa.RecordBatch]
    ) -> None:
        """Refuse FILE cells outside the caller's tenant prefix (no storage access)."""
        file_columns = [f.name for f in table_schema if is_file_field(f)]
        if not file_columns:
            return
        scope = self.settings.scope(principal.tenant_id) if self.settings is not None else None
        for batch in batches:
            for name in file_columns:
                if name not in batch.schema.names:
                    continue
                column = batch.column(name)
                present = column.filter(pc.is_valid(column))
                if len(present) == 0:
                    continue
                if scope is None:
                    raise LocationOutsideStage(f"{NO_STAGE_MESSAGE}, so it accepts no FILE values")
                for uri in pc.unique(pc.struct_field(present, "uri")).to_pylist():
                    scope.check(uri)

    async def close(self) -> None:
        if self._client_cm is not None:
            cm, self._client_cm, self._client = self._client_cm, None, None
            await cm.__aexit__(None, None, None)
