"""Where the managed stage is: parsed from process configuration, before any I/O.

Environment (also read by Query and Metasrv, which must agree):

- ``LAKE_S3_BUCKET``: the stage is S3, in this bucket.
- ``LAKE_MANAGED_OBJECT_PREFIX``: key prefix inside the bucket (default
  ``managed-objects``; ``/`` means the bucket root).
- ``LAKE_MANAGED_OBJECT_ROOT``: the stage is this local directory (default:
  ``<data-dir>/objects`` where the process has a data directory).
- ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and ``AWS_ENDPOINT_URL_S3`` /
  ``AWS_ENDPOINT_URL``: region and endpoint hints passed on to SDKs.

Setting both ``LAKE_S3_BUCKET`` and ``LAKE_MANAGED_OBJECT_ROOT`` is an error.
Tenants get ``tenants/<tenant-id>`` below the root or prefix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lake_core.config import MANAGED_OBJECT_PREFIX, MANAGED_OBJECT_ROOT, S3_BUCKET
from lake_core.errors import ConfigError, LakeError
from lake_objects.descriptor import StageDescriptor
from lake_objects.scope import TENANTS_DIR, TenantScope, safe_path_segments, validate_tenant_id

__all__ = [
    "DEFAULT_MANAGED_OBJECT_PREFIX",
    "MANAGED_OBJECT_PREFIX",
    "MANAGED_OBJECT_ROOT",
    "S3_BUCKET",
    "StageSettings",
]

DEFAULT_MANAGED_OBJECT_PREFIX = "managed-objects"

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class StageSettings:
    """The stage root of one deployment; :meth:`descriptor` derives a tenant's child."""

    kind: Literal["local", "s3"]
    root: str = ""
    bucket: str = ""
    prefix: str = ""
    region: str | None = None
    endpoint_url: str | None = None

    @classmethod
    def local(cls, root: str | os.PathLike[str]) -> StageSettings:
        return cls(kind="local", root=_local_root(os.fspath(root), "local stage root"))

    @classmethod
    def s3(
        cls,
        bucket: str,
        prefix: str = DEFAULT_MANAGED_OBJECT_PREFIX,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
    ) -> StageSettings:
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ConfigError(f"{S3_BUCKET} {bucket[:80]!r} is not a valid S3 bucket name")
        settings = cls(
            kind="s3",
            bucket=bucket,
            prefix=_prefix(prefix),
            region=region,
            endpoint_url=endpoint_url,
        )
        settings.descriptor("probe")  # validates region and endpoint shapes
        return settings

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        default_local_root: str | os.PathLike[str] | None = None,
    ) -> StageSettings | None:
        """The configured stage, or None when neither S3 nor a local root is configured."""
        source = os.environ if env is None else env
        bucket = (source.get(S3_BUCKET) or "").strip()
        root = (source.get(MANAGED_OBJECT_ROOT) or "").strip()
        if bucket and root:
            raise ConfigError(f"set either {S3_BUCKET} or {MANAGED_OBJECT_ROOT}, not both")
        if bucket:
            raw_prefix = source.get(MANAGED_OBJECT_PREFIX)
            prefix = DEFAULT_MANAGED_OBJECT_PREFIX if raw_prefix is None else raw_prefix.strip()
            region = (source.get("AWS_REGION") or source.get("AWS_DEFAULT_REGION") or "").strip()
            endpoint = (
                source.get("AWS_ENDPOINT_URL_S3") or source.get("AWS_ENDPOINT_URL") or ""
            ).strip()
            try:
                return cls.s3(bucket, prefix, region=region or None, endpoint_url=endpoint or None)
            except ConfigError:
                raise
            except (LakeError, ValueError) as exc:
                raise ConfigError(f"S3 managed stage configuration is invalid: {exc}") from None
        if root:
            return cls(kind="local", root=_local_root(root, MANAGED_OBJECT_ROOT))
        if default_local_root is not None:
            return cls(kind="local", root=_local_root(os.fspath(default_local_root), "--data-dir"))
        return None

    @property
    def base_uri(self) -> str:
        if self.kind == "local":
            return "file://" + self.root.rstrip("/")
        return "s3://" + self.bucket + ("/" + self.prefix if self.prefix else "")

    def tenant_uri(self, tenant_id: str) -> str:
        return f"{self.base_uri}/{TENANTS_DIR}/{validate_tenant_id(tenant_id)}"

    def scope(self, tenant_id: str) -> TenantScope:
        return TenantScope(self.tenant_uri(tenant_id))

    def descriptor(self, tenant_id: str) -> StageDescriptor:
        """The credential-free child-stage descriptor for one tenant."""
        try:
            return StageDescriptor(
                kind=self.kind,
                tenant_id=tenant_id,
                uri=self.tenant_uri(tenant_id),
                region=self.region if self.kind == "s3" else None,
                endpoint_url=self.endpoint_url if self.kind == "s3" else None,
            )
        except ValueError as exc:
            raise ConfigError(f"managed stage configuration is invalid: {exc}") from None


def _local_root(text: str, what: str) -> str:
    if text.startswith("file://"):
        text = text[len("file://") :]
    if not text or "\x00" in text:
        raise ConfigError(f"{what} must be a directory path")
    path = os.path.normpath(Path(text).expanduser().absolute())
    if path != "/":
        try:
            safe_path_segments(path.lstrip("/"), what)
        except LakeError:
            raise ConfigError(
                f"{what} {path[:200]!r} may only contain letters, digits and '_.~+=,@-' "
                "in its path segments (it becomes part of every file:// object URI)"
            ) from None
    return path


def _prefix(text: str) -> str:
    prefix = text.strip().strip("/")
    if prefix:
        try:
            safe_path_segments(prefix, MANAGED_OBJECT_PREFIX)
        except LakeError as exc:
            raise ConfigError(str(exc)) from None
    return prefix
