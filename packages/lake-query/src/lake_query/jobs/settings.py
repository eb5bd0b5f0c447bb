"""``LAKE_ASYNC_*``: durable async query configuration, parsed before the listener binds.

Local mode (no ``LAKE_S3_BUCKET``) needs ``--data-dir``: state and results go to
``<data-dir>/async-query-state`` and ``<data-dir>/async-query-results``, beside
the catalog. S3 mode keeps jobs in ``LAKE_ASYNC_DYNAMODB_TABLE`` and results
under ``LAKE_ASYNC_RESULT_PREFIX`` in the bucket.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lake_core import faults
from lake_core.cloud import DatasetStorage
from lake_core.config import (
    ASYNC_DYNAMODB_TABLE,
    ASYNC_EXECUTION_TIMEOUT_MS,
    ASYNC_GLOBAL_WORKER_CONCURRENCY,
    ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT,
    ASYNC_MAX_OUTSTANDING_PER_TENANT,
    ASYNC_MAX_RESULT_BYTES,
    ASYNC_QUERIES,
    ASYNC_RESULT_PREFIX,
    ASYNC_WORKER_CONCURRENCY,
    ASYNC_WORKER_CONCURRENCY_PER_TENANT,
    DYNAMODB_TABLE,
    MANIFEST_DYNAMODB_TABLE,
    S3_BUCKET,
    env_int,
)
from lake_core.errors import ConfigError

__all__ = ["MAX_PART_BYTES", "AsyncSettings"]

#: The encoded-byte ceiling of one result part.
MAX_PART_BYTES = 64 * 1024 * 1024
#: How long a claimed job's lease lasts without renewal.
LEASE_MS = 10_000

_DYNAMO_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_SEGMENT = re.compile(r"[A-Za-z0-9_.=+-]+")


def _flag(env: Mapping[str, str]) -> bool:
    raw = (env.get(ASYNC_QUERIES) or "").strip().lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise ConfigError(f"{ASYNC_QUERIES} must be true or false, got {raw[:20]!r}")


def _prefix(env: Mapping[str, str]) -> str:
    raw = (env.get(ASYNC_RESULT_PREFIX) or "async-query-results").strip().strip("/")
    segments = raw.split("/")
    if len(raw) > 512 or any(s in ("", ".", "..") or not _SEGMENT.fullmatch(s) for s in segments):
        raise ConfigError(
            f"{ASYNC_RESULT_PREFIX} must be '/'-separated segments of letters, digits and '_.=+-'"
        )
    return raw


@dataclass(frozen=True)
class AsyncSettings:
    """Where async state and results live, and the limits workers enforce."""

    mode: Literal["local", "s3"]
    state_dir: Path | None = None
    results_dir: Path | None = None
    bucket: str = ""
    result_prefix: str = "async-query-results"
    dynamodb_table: str = "lake_async_queries"
    region: str | None = None
    s3_endpoint: str | None = None
    dynamodb_endpoint: str | None = None
    worker_concurrency: int = 4
    worker_concurrency_per_tenant: int = 1
    execution_timeout_ms: int = 1_800_000
    global_concurrency: int | None = None
    global_concurrency_per_tenant: int | None = None
    max_outstanding_per_tenant: int = 8
    max_result_bytes: int = 16 * 1024**3
    part_bytes: int = MAX_PART_BYTES
    lease_ms: int = LEASE_MS

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, data_dir: str | os.PathLike[str] | None
    ) -> AsyncSettings | None:
        """The settings, or None unless ``LAKE_ASYNC_QUERIES=true``."""
        source = os.environ if env is None else env
        if not _flag(source):
            return None
        total = env_int(ASYNC_WORKER_CONCURRENCY, 4, 1, 64, source)
        per_tenant = env_int(ASYNC_WORKER_CONCURRENCY_PER_TENANT, 1, 1, 64, source)
        if per_tenant > total:
            raise ConfigError(
                f"{ASYNC_WORKER_CONCURRENCY_PER_TENANT} must not exceed {ASYNC_WORKER_CONCURRENCY}"
            )
        fleet = [
            (source.get(name) or "").strip()
            for name in (
                ASYNC_GLOBAL_WORKER_CONCURRENCY,
                ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT,
            )
        ]
        global_total = global_tenant = None
        if any(fleet):
            if not all(fleet):
                raise ConfigError(
                    f"set both {ASYNC_GLOBAL_WORKER_CONCURRENCY} and "
                    f"{ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT}, or neither"
                )
            global_total = env_int(ASYNC_GLOBAL_WORKER_CONCURRENCY, 1, 1, 64, source)
            global_tenant = env_int(ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT, 1, 1, 64, source)
            if global_tenant > global_total:
                raise ConfigError(
                    f"{ASYNC_GLOBAL_WORKER_CONCURRENCY_PER_TENANT} must not exceed "
                    f"{ASYNC_GLOBAL_WORKER_CONCURRENCY}"
                )
        limits = {
            "worker_concurrency": total,
            "worker_concurrency_per_tenant": per_tenant,
            "execution_timeout_ms": env_int(
                ASYNC_EXECUTION_TIMEOUT_MS, 1_800_000, 1000, 86_400_000, source
            ),
            "global_concurrency": global_total,
            "global_concurrency_per_tenant": global_tenant,
            "max_outstanding_per_tenant": env_int(
                ASYNC_MAX_OUTSTANDING_PER_TENANT, 8, 1, 128, source
            ),
            "max_result_bytes": env_int(
                ASYNC_MAX_RESULT_BYTES, 16 * 1024**3, 64 * 1024**2, 256 * 1024**3, source
            ),
        }
        test = faults.configure(source)
        limits["part_bytes"] = test.setting(faults.ASYNC_PART_BYTES) or MAX_PART_BYTES
        limits["lease_ms"] = test.setting(faults.ASYNC_LEASE_MS) or LEASE_MS
        limits["max_result_bytes"] = (
            test.setting(faults.ASYNC_RESULT_BYTES) or limits["max_result_bytes"]
        )
        bucket = (source.get(S3_BUCKET) or "").strip()
        if bucket:
            table = (source.get(ASYNC_DYNAMODB_TABLE) or "lake_async_queries").strip()
            if not _DYNAMO_TABLE.fullmatch(table):
                raise ConfigError(f"{ASYNC_DYNAMODB_TABLE} must be a DynamoDB table name")
            others = {
                (source.get(n) or "").strip() for n in (DYNAMODB_TABLE, MANIFEST_DYNAMODB_TABLE)
            }
            storage = DatasetStorage.from_env(source)
            if table in others | {storage.manifest_table, "lake_registry"}:
                raise ConfigError(
                    f"{ASYNC_DYNAMODB_TABLE} must name its own table, not the registry or manifests"
                )
            return cls(
                mode="s3",
                bucket=bucket,
                result_prefix=_prefix(source),
                dynamodb_table=table,
                region=storage.region or "us-east-1",
                s3_endpoint=storage.s3_endpoint,
                dynamodb_endpoint=storage.dynamodb_endpoint,
                **limits,  # type: ignore[arg-type]
            )
        if data_dir is None:
            raise ConfigError(
                f"{ASYNC_QUERIES}=true in local mode needs --data-dir (the catalog's directory), "
                f"or {S3_BUCKET} for S3 mode"
            )
        root = Path(data_dir)
        return cls(
            mode="local",
            state_dir=root / "async-query-state",
            results_dir=root / "async-query-results",
            **limits,  # type: ignore[arg-type]
        )
