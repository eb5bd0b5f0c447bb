"""Cloud mode settings: tables on S3, the registry and Lance manifests on DynamoDB.

Pure parsing, no I/O: every process validates these before a listener binds.

Metasrv (``LAKE_CLOUD_MODE=true``) needs :class:`CloudSettings`:

- ``LAKE_S3_BUCKET``: the bucket holding every table (and the managed stage).
- ``LAKE_TABLE_PREFIX``: key prefix of the tables inside the bucket (default:
  the bucket root). Tables live at
  ``s3://$LAKE_S3_BUCKET/$LAKE_TABLE_PREFIX/<namespace>/<table>.lance``;
  only Metasrv derives that location, no client ever names one.
- ``LAKE_DYNAMODB_TABLE`` (default ``lake_registry``): Metasrv's registry.
- ``LAKE_MANIFEST_DYNAMODB_TABLE`` (default ``lake_manifests``): Lance's
  commit pointer and manifest history for S3 datasets. Must differ from the
  registry table: Query reads this one and never the registry.
- ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), required in cloud mode.
- ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL_DYNAMODB`` (each falling back
  to ``AWS_ENDPOINT_URL``) for S3-compatible and local endpoints.
- ``LAKE_STORAGE_TIMEOUT_MS`` (default 10000): the bound of one S3 request
  made through Lance, so an unreachable S3 surfaces as UNAVAILABLE instead of
  a hang.

Query needs only :class:`DatasetStorage` (the manifest table, region,
endpoints and timeout) to open ``s3://`` datasets read-only.

Credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID`` and
friends, or a workload identity); they are handed to Lance and never shown
in a ``repr``, a log line or an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from lake_core.config import (
    CLOUD_MODE,
    DYNAMODB_TABLE,
    MANIFEST_DYNAMODB_TABLE,
    S3_BUCKET,
    STORAGE_TIMEOUT_MS,
    TABLE_PREFIX,
    env_int,
)
from lake_core.errors import ConfigError
from lake_core.names import TableRef

__all__ = [
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "CLOUD_MODE",
    "DEFAULT_DYNAMODB_TABLE",
    "DEFAULT_MANIFEST_DYNAMODB_TABLE",
    "DEFAULT_STORAGE_TIMEOUT_MS",
    "DYNAMODB_TABLE",
    "INTEGRITY_DIR",
    "MANIFEST_DYNAMODB_TABLE",
    "S3_BUCKET",
    "SIDECAR_DIR",
    "STORAGE_TIMEOUT_MS",
    "TABLE_PREFIX",
    "CloudSettings",
    "DatasetStorage",
    "cloud_mode",
    "split_s3_uri",
]

AWS_REGION = "AWS_REGION"
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
AWS_ENDPOINT_URL_S3 = "AWS_ENDPOINT_URL_S3"
AWS_ENDPOINT_URL_DYNAMODB = "AWS_ENDPOINT_URL_DYNAMODB"

DEFAULT_DYNAMODB_TABLE = "lake_registry"
DEFAULT_MANIFEST_DYNAMODB_TABLE = "lake_manifests"
DEFAULT_STORAGE_TIMEOUT_MS = 10_000
#: Sidecars of S3 tables live under ``<table prefix>/_lake-sidecars``: the dash
#: keeps the name out of the namespace space (namespaces are identifiers).
SIDECAR_DIR = "_lake-sidecars"
#: Data-file digest records of S3 tables, beside the sidecars.
INTEGRITY_DIR = "_lake-integrity"

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_DYNAMO_TABLE = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9_.=+-]+")
_REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+-[0-9]+|[a-z0-9-]{2,32}")
_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_STORAGE_OPTION_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def _value(env: Mapping[str, str], name: str) -> str:
    return (env.get(name) or "").strip()


def cloud_mode(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``LAKE_CLOUD_MODE`` asks for S3 + DynamoDB."""
    raw = _value(os.environ if env is None else env, CLOUD_MODE).lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise ConfigError(f"{CLOUD_MODE} must be true or false, got {raw[:20]!r}")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri[:200]!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _endpoint(env: Mapping[str, str], specific: str) -> str | None:
    name = specific if _value(env, specific) else AWS_ENDPOINT_URL
    url = _value(env, name)
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name} must be an http(s) URL, got {url[:100]!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        # Never echo it: the userinfo part may be a credential.
        raise ConfigError(f"{name} must not carry credentials, a query or a fragment")
    return url.rstrip("/")


def _region(env: Mapping[str, str], required: bool) -> str | None:
    region = _value(env, AWS_REGION) or _value(env, AWS_DEFAULT_REGION)
    if not region:
        if required:
            raise ConfigError(f"cloud mode needs {AWS_REGION} (or {AWS_DEFAULT_REGION})")
        return None
    if not _REGION.fullmatch(region):
        raise ConfigError(f"{AWS_REGION} {region[:40]!r} is not a region name")
    return region


def _dynamo_table(env: Mapping[str, str], name: str, default: str) -> str:
    value = _value(env, name) or default
    if not _DYNAMO_TABLE.fullmatch(value):
        raise ConfigError(f"{name} must be a DynamoDB table name (3-255 of A-Z a-z 0-9 _ . -)")
    return value


def _table_prefix(env: Mapping[str, str]) -> str:
    raw = _value(env, TABLE_PREFIX).strip("/")
    if not raw:
        return ""
    if len(raw) > 512:
        raise ConfigError(f"{TABLE_PREFIX} is longer than 512 characters")
    for segment in raw.split("/"):
        if segment in ("", ".", "..") or not _PREFIX_SEGMENT.fullmatch(segment):
            raise ConfigError(
                f"{TABLE_PREFIX} {raw[:100]!r} must be '/'-separated segments of letters, "
                "digits and '_.=+-' (no empty, '.' or '..' segments)"
            )
        if segment in (SIDECAR_DIR, INTEGRITY_DIR):
            raise ConfigError(f"{TABLE_PREFIX} must not contain the reserved {segment!r}")
    return raw


@dataclass(frozen=True)
class DatasetStorage:
    """How a process opens Lance datasets: local paths as-is, ``s3://`` through DynamoDB.

    ``lance_uri`` turns the stable ``s3://bucket/key.lance`` identity stored in
    the registry into Lance's ``s3+ddb://`` form naming the manifest table;
    ``storage_options`` carries the endpoints, bounded timeouts and (only
    when set in the environment) static credentials.
    """

    manifest_table: str = DEFAULT_MANIFEST_DYNAMODB_TABLE
    region: str | None = None
    s3_endpoint: str | None = None
    dynamodb_endpoint: str | None = None
    timeout_ms: int = DEFAULT_STORAGE_TIMEOUT_MS
    _credentials: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, require_region: bool = False
    ) -> DatasetStorage:
        source = os.environ if env is None else env
        credentials = tuple(
            (option, _value(source, variable))
            for variable, option in zip(_CREDENTIAL_VARS, _STORAGE_OPTION_KEYS, strict=True)
            if _value(source, variable)
        )
        return cls(
            manifest_table=_dynamo_table(
                source, MANIFEST_DYNAMODB_TABLE, DEFAULT_MANIFEST_DYNAMODB_TABLE
            ),
            region=_region(source, require_region),
            s3_endpoint=_endpoint(source, AWS_ENDPOINT_URL_S3),
            dynamodb_endpoint=_endpoint(source, AWS_ENDPOINT_URL_DYNAMODB),
            timeout_ms=env_int(
                STORAGE_TIMEOUT_MS, DEFAULT_STORAGE_TIMEOUT_MS, 100, 600_000, source
            ),
            _credentials=credentials,
        )

    @staticmethod
    def is_s3(location: str) -> bool:
        return location.startswith("s3://")

    def lance_uri(self, location: str) -> str:
        """The URI Lance opens for a registry location."""
        if not self.is_s3(location):
            return location
        return f"s3+ddb://{location[len('s3://') :]}?ddbTableName={self.manifest_table}"

    def committed_read(self, location: str) -> tuple[str, dict[str, str] | None]:
        """The URI and options that open a committed version without DynamoDB.

        Lance's DynamoDB store only decides which manifest becomes a version;
        its commit then copies that manifest to the version's own path in S3
        before returning. A version Metasrv registered can therefore be read
        from S3 alone, which a DynamoDB outage does not stop. A manifest
        whose copy a crash cut short is only named in DynamoDB: open it
        through :meth:`lance_uri` when this fails.
        """
        options = self.storage_options(location)
        if options is not None:
            options = {k: v for k, v in options.items() if k != "dynamodb_endpoint"}
        return location, options

    def manifest_base_uri(self, location: str) -> str:
        """The key Lance's DynamoDB manifest store files a dataset under (no bucket)."""
        return split_s3_uri(location)[1].rstrip("/")

    def storage_options(self, location: str) -> dict[str, str] | None:
        """Lance ``storage_options`` for ``location`` (None for a local path)."""
        if not self.is_s3(location):
            return None
        timeout_s = max(1, self.timeout_ms // 1000)
        options = {
            "timeout": f"{self.timeout_ms}ms",
            "connect_timeout": f"{max(100, min(self.timeout_ms, 3000))}ms",
            "client_max_retries": "2",
            "client_retry_timeout": str(timeout_s),
        }
        if self.region:
            options["region"] = self.region
        if self.s3_endpoint:
            options["endpoint"] = self.s3_endpoint
            if self.s3_endpoint.startswith("http://"):
                options["allow_http"] = "true"
        if self.dynamodb_endpoint:
            options["dynamodb_endpoint"] = self.dynamodb_endpoint
        options.update(self._credentials)
        return options


@dataclass(frozen=True)
class CloudSettings:
    """Metasrv's cloud deployment: where tables, sidecars and the registry live."""

    bucket: str
    table_prefix: str
    registry_table: str
    storage: DatasetStorage

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CloudSettings | None:
        """The cloud settings, or None unless ``LAKE_CLOUD_MODE=true``."""
        source = os.environ if env is None else env
        if not cloud_mode(source):
            return None
        bucket = _value(source, S3_BUCKET)
        if not bucket:
            raise ConfigError(f"{CLOUD_MODE}=true needs {S3_BUCKET}")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ConfigError(f"{S3_BUCKET} {bucket[:80]!r} is not a valid S3 bucket name")
        storage = DatasetStorage.from_env(source, require_region=True)
        registry = _dynamo_table(source, DYNAMODB_TABLE, DEFAULT_DYNAMODB_TABLE)
        if registry == storage.manifest_table:
            raise ConfigError(
                f"{DYNAMODB_TABLE} and {MANIFEST_DYNAMODB_TABLE} must name different tables "
                f"(both are {registry!r}): Query may read manifests but never the registry"
            )
        return cls(
            bucket=bucket,
            table_prefix=_table_prefix(source),
            registry_table=registry,
            storage=storage,
        )

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.table_prefix, *parts) if p)

    def table_location(self, table: TableRef) -> str:
        """``s3://bucket/prefix/<namespace>/<table>.lance``: the only place a table lives."""
        # TableRef parts are validated identifiers: no separators, no dots.
        return f"s3://{self.bucket}/{self._key(table.namespace, f'{table.name}.lance')}"

    @property
    def sidecar_prefix(self) -> str:
        """Key prefix (no bucket) of the reference-delta sidecars."""
        return self._key(SIDECAR_DIR)

    @property
    def integrity_prefix(self) -> str:
        """Key prefix (no bucket) of the data-file digest records."""
        return self._key(INTEGRITY_DIR)
