"""The registrar's configuration: a ``sinks:`` entry of kind ``iceberg``, validated at startup.

The file is either a whole ``sinks:`` document (its one ``kind: iceberg``
entry is used) or that entry's ``config`` mapping alone. String values may be
``${file:/path}`` or ``${env:NAME}`` references; secrets resolved from them
are held in :class:`Secret`, whose ``repr`` and ``str`` never show the value.
Every rule of the spec's configuration notes is checked here, before the
registrar talks to anyone.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
import yaml

from lake_core.auth import Secret
from lake_iceberg.errors import ConfigInvalid

__all__ = [
    "CatalogCredential",
    "RegistrarConfig",
    "RetryPolicy",
    "Secret",
    "StoreConfig",
    "load_config",
    "parse_config",
    "parse_duration",
]

log = structlog.get_logger("lake.iceberg.registrar")

_REF = re.compile(r"^\$\{(file|env):(.+)\}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

_TOP_KEYS = {
    "from",
    "pipeline",
    "warehouse",
    "catalog_uri",
    "catalog_ca_file",
    "catalog_token",
    "catalog_credential",
    "catalog_client_cert",
    "catalog_client_key",
    "url",
    "namespace",
    "create_table",
    "store",
    "retry",
}
_CREDENTIAL_KEYS = {"client_id", "client_secret", "scope", "oauth2_server_uri"}
_STORE_KEYS = {"endpoint", "region", "allow_http", "access_key_id", "secret_access_key"}
_RETRY_KEYS = {"initial", "max", "jitter"}


@dataclass(frozen=True)
class CatalogCredential:
    client_id: str
    client_secret: Secret
    scope: str | None = None
    oauth2_server_uri: str | None = None


@dataclass(frozen=True)
class StoreConfig:
    endpoint: str | None = None
    region: str = "us-east-1"
    allow_http: bool = False
    access_key_id: Secret | None = None
    secret_access_key: Secret | None = None


@dataclass(frozen=True)
class RetryPolicy:
    initial: float = 1.0
    max: float = 60.0
    jitter: bool = True

    def delay(self, attempt: int, draw: float = 1.0) -> float:
        """The wait before retry ``attempt`` (0-based); ``draw`` in [0, 1) when jittered."""
        base = min(self.max, self.initial * (2.0**attempt))
        return base * (0.5 + draw / 2) if self.jitter else base


@dataclass(frozen=True)
class RegistrarConfig:
    segments_dir: Path
    pipeline: str
    catalog_uri: str
    url: str
    namespace: tuple[str, ...]
    warehouse: str | None = None
    catalog_ca_file: Path | None = None
    catalog_token: Secret | None = None
    catalog_credential: CatalogCredential | None = None
    catalog_client_cert: Path | None = None
    catalog_client_key: Path | None = None
    create_table: bool = False
    store: StoreConfig = field(default_factory=StoreConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @property
    def bucket(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def prefix(self) -> str:
        return urlsplit(self.url).path.strip("/")

    def dataset_prefix(self, dataset: str) -> str:
        """The key prefix the shipper uploads ``dataset`` under (no trailing slash)."""
        parts = [self.prefix, "lake", "v1", self.pipeline, dataset]
        return "/".join(p for p in parts if p)

    def table_location(self, dataset: str) -> str:
        return f"s3://{self.bucket}/{self.dataset_prefix(dataset)}"


def parse_duration(value: object, key: str) -> float:
    """Seconds from ``1s``, ``500ms``, ``2m``, ``1h`` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ConfigInvalid(f"{key}: expected a duration such as 1s or 500ms")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if match is None:
            raise ConfigInvalid(f"{key}: expected a duration such as 1s or 500ms, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ConfigInvalid(f"{key}: must be positive")
    return seconds


def _resolve(value: object, key: str) -> object:
    """Expand a ``${file:}`` / ``${env:}`` reference; the error names the key, not the value."""
    if not isinstance(value, str):
        return value
    match = _REF.match(value.strip())
    if match is None:
        return value
    kind, target = match.groups()
    if kind == "env":
        found = os.environ.get(target)
        if found is None:
            raise ConfigInvalid(f"{key}: environment variable {target} is not set")
        return found
    try:
        return Path(target).read_text().rstrip("\r\n")
    except OSError as exc:
        raise ConfigInvalid(f"{key}: cannot read secret file {target} ({exc.strerror})") from None


def _mapping(value: object, key: str, allowed: set[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigInvalid(f"{key}: expected a mapping")
    unknown = sorted(set(map(str, value)) - allowed)
    if unknown:
        raise ConfigInvalid(f"{key}: unknown key(s) {', '.join(unknown)}")
    return {str(k): _resolve(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}


def _string(raw: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None or value == "":
        if required:
            raise ConfigInvalid(f"{key}: required")
        return None
    if not isinstance(value, str):
        raise ConfigInvalid(f"{key}: expected a string")
    return value


def _bool(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigInvalid(f"{key}: expected true or false")
    return value


def _secret(raw: Mapping[str, Any], key: str, *, required: bool = False) -> Secret | None:
    value = _string(raw, key, required=required)
    return None if value is None else Secret(value)


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _http_url(url: str, key: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigInvalid(f"{key}: expected an http:// or https:// URL")
    return url.rstrip("/")


def _existing_file(raw: Mapping[str, Any], key: str) -> Path | None:
    value = _string(raw, key, required=False)
    if value is None:
        return None
    path = Path(value)
    if not path.is_file():
        raise ConfigInvalid(f"{key}: {path} is not a readable file")
    return path


def _check_ca_file(path: Path) -> None:
    """An unreadable or certificate-less CA bundle fails at startup, not at first use."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigInvalid(
            f"catalog_ca_file: {path} holds no usable certificate ({exc})"
        ) from None
    if not context.get_ca_certs():
        raise ConfigInvalid(f"catalog_ca_file: {path} holds no certificate")


def _check_client_pair(cert: Path, key: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    except (OSError, ssl.SSLError):
        raise ConfigInvalid(
            "catalog_client_cert / catalog_client_key: not a PEM certificate and its private key"
        ) from None


def _sink_entry(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``config`` of the one ``kind: iceberg`` entry, or the mapping itself."""
    if "sinks" not in document:
        return document
    sinks = document["sinks"]
    if not isinstance(sinks, list):
        raise ConfigInvalid("sinks: expected a list of sink entries")
    entries = [s for s in sinks if isinstance(s, Mapping) and s.get("kind") == "iceberg"]
    if len(entries) != 1:
        raise ConfigInvalid(
            f"sinks: expected exactly one kind: iceberg entry, found {len(entries)}"
        )
    config = entries[0].get("config")
    if not isinstance(config, Mapping):
        raise ConfigInvalid(f"sinks[{entries[0].get('id', 'iceberg')}].config: expected a mapping")
    return config


def parse_config(document: object, *, base_dir: Path | None = None) -> RegistrarConfig:
    """Validate a parsed YAML document into a :class:`RegistrarConfig`."""
    if not isinstance(document, Mapping):
        raise ConfigInvalid("the configuration must be a mapping")
    raw = _mapping(_sink_entry(document), "", _TOP_KEYS)

    segments = _string(raw, "from")
    assert segments is not None
    segments_dir = Path(segments)
    if base_dir is not None and not segments_dir.is_absolute():
        segments_dir = base_dir / segments_dir
    pipeline = _string(raw, "pipeline")
    assert pipeline is not None
    if not _NAME.match(pipeline):
        raise ConfigInvalid("pipeline: letters, digits, '_', '.', '-' only")

    catalog_uri = _http_url(_string(raw, "catalog_uri") or "", "catalog_uri")
    https = catalog_uri.startswith("https://")

    url = _string(raw, "url")
    assert url is not None
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigInvalid("url: expected s3://bucket/prefix")

    namespace_text = _string(raw, "namespace")
    assert namespace_text is not None
    namespace = tuple(namespace_text.split("."))
    if any(not part for part in namespace):
        raise ConfigInvalid("namespace: empty level in a dotted name")

    token = _secret(raw, "catalog_token")
    credential = _credential(raw.get("catalog_credential"), catalog_uri)
    if token is not None and credential is not None:
        raise ConfigInvalid("catalog_token and catalog_credential: set one, not both")

    ca_file = _existing_file(raw, "catalog_ca_file")
    if ca_file is not None:
        if not https:
            raise ConfigInvalid("catalog_ca_file: only with an https:// catalog_uri")
        _check_ca_file(ca_file)

    client_cert = _existing_file(raw, "catalog_client_cert")
    client_key = _existing_file(raw, "catalog_client_key")
    if (client_cert is None) != (client_key is None):
        raise ConfigInvalid("catalog_client_cert and catalog_client_key: set both or neither")
    if client_cert is not None and client_key is not None:
        if not https:
            raise ConfigInvalid("catalog_client_cert: mutual TLS needs an https:// catalog_uri")
        _check_client_pair(client_cert, client_key)

    if token is not None or credential is not None:
        cleartext = [u for u in _credential_urls(catalog_uri, credential) if _cleartext(u)]
        for target in cleartext:
            log.warning("registrar.cleartext_credentials", url=target)

    config = RegistrarConfig(
        segments_dir=segments_dir,
        pipeline=pipeline,
        catalog_uri=catalog_uri,
        url=url.rstrip("/"),
        namespace=namespace,
        warehouse=_string(raw, "warehouse", required=False),
        catalog_ca_file=ca_file,
        catalog_token=token,
        catalog_credential=credential,
        catalog_client_cert=client_cert,
        catalog_client_key=client_key,
        create_table=_bool(raw, "create_table", False),
        store=_store(raw.get("store")),
        retry=_retry(raw.get("retry")),
    )
    return config


def _credential_urls(catalog_uri: str, credential: CatalogCredential | None) -> list[str]:
    urls = [catalog_uri]
    if credential is not None and credential.oauth2_server_uri:
        urls.append(credential.oauth2_server_uri)
    return urls


def _cleartext(url: str) -> bool:
    return url.startswith("http://") and not _is_loopback(url)


def _credential(value: object, catalog_uri: str) -> CatalogCredential | None:
    if value is None:
        return None
    raw = _mapping(value, "catalog_credential", _CREDENTIAL_KEYS)
    client_id = _string(raw, "client_id")
    assert client_id is not None
    if ":" in client_id:
        raise ConfigInvalid("catalog_credential.client_id: must not contain ':'")
    secret = _secret(raw, "client_secret", required=True)
    assert secret is not None
    server = _string(raw, "oauth2_server_uri", required=False)
    if server is not None:
        server = _http_url(server, "catalog_credential.oauth2_server_uri")
    return CatalogCredential(
        client_id=client_id,
        client_secret=secret,
        scope=_string(raw, "scope", required=False),
        oauth2_server_uri=server,
    )


def _store(value: object) -> StoreConfig:
    raw = _mapping(value, "store", _STORE_KEYS)
    endpoint = _string(raw, "endpoint", required=False)
    allow_http = _bool(raw, "allow_http", False)
    if endpoint is not None:
        endpoint = _http_url(endpoint, "store.endpoint")
        if endpoint.startswith("http://") and not allow_http:
            raise ConfigInvalid("store.endpoint: http:// needs store.allow_http: true")
    key_id = _secret(raw, "access_key_id")
    key_secret = _secret(raw, "secret_access_key")
    if (key_id is None) != (key_secret is None):
        raise ConfigInvalid("store.access_key_id and store.secret_access_key: set both or neither")
    return StoreConfig(
        endpoint=endpoint,
        region=_string(raw, "region", required=False) or "us-east-1",
        allow_http=allow_http,
        access_key_id=key_id,
        secret_access_key=key_secret,
    )


def _retry(value: object) -> RetryPolicy:
    if isinstance(value, Mapping):
        raw = _mapping(value, "retry", _RETRY_KEYS)
    elif value is None:
        raw = {}
    else:
        raise ConfigInvalid("retry: expected a mapping {initial, max, jitter}")
    initial = parse_duration(raw.get("initial", "1s"), "retry.initial")
    maximum = parse_duration(raw.get("max", "60s"), "retry.max")
    if maximum < initial:
        raise ConfigInvalid("retry.max: must be at least retry.initial")
    return RetryPolicy(initial=initial, max=maximum, jitter=_bool(raw, "jitter", True))


def load_config(path: str | os.PathLike[str]) -> RegistrarConfig:
    """Read and validate a YAML configuration file; relative ``from`` is relative to it."""
    file = Path(path)
    try:
        document = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ConfigInvalid(f"cannot read config file {file} ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigInvalid(f"config file {file} is not valid YAML ({exc})") from None
    return parse_config(document, base_dir=file.parent)
