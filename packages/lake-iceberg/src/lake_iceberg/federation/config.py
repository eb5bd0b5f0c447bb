"""Federation configuration: the ``LAKE_ICEBERG_*`` variables, validated whole.

Rules (each failure is a :class:`~lake_core.errors.ConfigError` naming the
variable, never its value when the value is a secret or the warehouse):

- ``LAKE_ICEBERG_REST_ENDPOINT``, ``LAKE_ICEBERG_WAREHOUSE`` and
  ``LAKE_ICEBERG_NAMESPACES``: all three (enabled) or none (disabled).
- External endpoints (catalog, OAuth token endpoint, S3 override) are
  credential-free ``https://`` URLs, or ``http://`` on a numeric loopback IP
  (127.0.0.0/8, ::1) only: never ``localhost``, never userinfo.
- ``LAKE_ICEBERG_S3_ENDPOINT`` and ``LAKE_ICEBERG_S3_REGION`` come in pairs;
  the path-style and anonymous flags are ``true`` or ``false``, nothing else.
- ``LAKE_ICEBERG_REST_TOKEN`` and ``LAKE_ICEBERG_REST_CREDENTIAL`` exclude each
  other; the credential is ``client-id:client-secret``; the OAuth options
  require the credential.
- ``LAKE_ICEBERG_LOCATION`` (else ``LAKE_ICEBERG_WAREHOUSE``) is a location
  (``s3://bucket/prefix``, ``file:///path``): the only place Query opens a
  table's files (:mod:`~lake_iceberg.federation.locations`).
- ``LAKE_ICEBERG_REST_TIMEOUT_MS`` and ``LAKE_ICEBERG_S3_TIMEOUT_MS``: integers
  in range (milliseconds).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from lake_core.auth import Secret
from lake_core.config import (
    ICEBERG_LOCATION,
    ICEBERG_NAMESPACES,
    ICEBERG_REST_CREDENTIAL,
    ICEBERG_REST_ENDPOINT,
    ICEBERG_REST_OAUTH2_SERVER_URI,
    ICEBERG_REST_OAUTH_AUDIENCE,
    ICEBERG_REST_OAUTH_RESOURCE,
    ICEBERG_REST_OAUTH_SCOPE,
    ICEBERG_REST_TIMEOUT_MS,
    ICEBERG_REST_TOKEN,
    ICEBERG_S3_ANONYMOUS,
    ICEBERG_S3_ENDPOINT,
    ICEBERG_S3_PATH_STYLE,
    ICEBERG_S3_REGION,
    ICEBERG_S3_TIMEOUT_MS,
    ICEBERG_WAREHOUSE,
    env_int,
)
from lake_core.errors import ConfigError, InvalidName
from lake_core.names import validate_identifier
from lake_iceberg.federation.locations import Locations

__all__ = [
    "REQUIRED",
    "FederationConfig",
    "OAuthSettings",
    "catalog_file_io",
    "check_external_url",
]

#: The triple that turns federation on.
REQUIRED = (ICEBERG_REST_ENDPOINT, ICEBERG_WAREHOUSE, ICEBERG_NAMESPACES)
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_S3_TIMEOUT_MS = 10_000
#: pyiceberg's file I/O over pyarrow's filesystems (the one the timeouts reach).
PYARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
DEFAULT_SCOPE = "catalog"
#: Credentials a catalog may vend for a table's files (Query then reads as the catalog says).
VENDED = ("s3.access-key-id", "s3.secret-access-key")
#: The other table config properties a catalog may set: none routes or re-identifies Query.
CATALOG_FILE_IO = frozenset(
    {*VENDED, "s3.session-token", "s3.region", "client.region", "s3.path-style-access"}
)


def check_external_url(value: str, variable: str) -> str:
    """A credential-free https:// URL, or http:// on a numeric loopback IP."""
    try:
        parts = urlsplit(value)
        host = parts.hostname
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        raise ConfigError(f"{variable} must be an http(s) URL") from None
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise ConfigError(f"{variable} must not carry credentials in the URL")
    if parts.query or parts.fragment:
        raise ConfigError(f"{variable} must not have a query or fragment")
    if not host:
        raise ConfigError(f"{variable} must be an http(s) URL with a host")
    if parts.scheme == "https":
        return value.rstrip("/")
    if parts.scheme != "http":
        raise ConfigError(f"{variable} must use https:// (or http:// on a loopback IP)")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a DNS name, localhost included: it may resolve anywhere
    if not loopback:
        raise ConfigError(
            f"{variable}: plain http:// is allowed only on a numeric loopback IP "
            "(127.0.0.0/8 or ::1); use https://"
        )
    return value.rstrip("/")


def catalog_file_io(config: Mapping[str, str]) -> dict[str, str]:
    """The file-I/O properties Lake takes from a catalog's table config.

    Vended credentials, the region and path style, and the catalog's endpoint
    only with credentials it vends: then Query signs with the catalog's key,
    not its own. Everything else (a proxy, a role to assume, an endpoint for
    Query's own identity, another FileIO) would let the catalog send
    Query's requests, signed with Query's credentials, where the operator never
    configured: it is dropped.
    """
    kept = {key: value for key, value in config.items() if key in CATALOG_FILE_IO}
    if all(config.get(key) for key in VENDED) and "s3.endpoint" in config:
        kept["s3.endpoint"] = config["s3.endpoint"]
    return kept


def _strict_bool(source: Mapping[str, str], variable: str) -> bool | None:
    raw = source.get(variable)
    if raw is None or raw == "":
        return None
    if raw not in ("true", "false"):
        raise ConfigError(f"{variable} must be true or false")
    return raw == "true"


def _text(source: Mapping[str, str], variable: str) -> str | None:
    raw = source.get(variable)
    if raw is None:
        return None
    raw = raw.strip()
    return raw or None


@dataclass(frozen=True, repr=False)
class OAuthSettings:
    """OAuth2 client credentials and the token request's options."""

    client_id: str
    client_secret: Secret
    server_uri: str | None = None
    scope: str = DEFAULT_SCOPE
    audience: str | None = None
    resource: str | None = None

    def __repr__(self) -> str:
        return "OAuthSettings(client_id='***', client_secret='***')"


@dataclass(frozen=True, repr=False)
class FederationConfig:
    """The validated federation settings of one Query replica."""

    endpoint: str
    warehouse: Secret  # opaque in diagnostics, revealed only to the REST client
    namespaces: frozenset[str]
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    token: Secret | None = None
    oauth: OAuthSettings | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_path_style: bool | None = None
    s3_anonymous: bool = False
    s3_timeout_ms: int = DEFAULT_S3_TIMEOUT_MS
    extra_file_io: Mapping[str, str] = field(default_factory=dict)
    #: LAKE_ICEBERG_LOCATION; None: the warehouse is the location.
    location: Secret | None = None

    def __repr__(self) -> str:
        auth = "oauth" if self.oauth else "token" if self.token else "none"
        return (
            f"FederationConfig(endpoint={self.endpoint!r}, namespaces={sorted(self.namespaces)!r}, "
            f"auth={auth!r}, timeout_ms={self.timeout_ms})"
        )

    __str__ = __repr__

    def locations(self) -> Locations:
        """Where the tables' files may be; ConfigError when that is not a location."""
        if self.location is not None:
            return Locations(self.location.reveal(), ICEBERG_LOCATION.name)
        return Locations(self.warehouse.reveal(), ICEBERG_WAREHOUSE.name)

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    @property
    def s3_timeout_s(self) -> float:
        return self.s3_timeout_ms / 1000

    def file_io_overrides(self) -> dict[str, str]:
        """Client-side S3 properties that take precedence over the catalog's (no credentials)."""
        props: dict[str, str] = dict(self.extra_file_io)
        if self.s3_endpoint is not None:
            props["s3.endpoint"] = self.s3_endpoint
        if self.s3_region is not None:
            props["s3.region"] = self.s3_region
        if self.s3_path_style is not None:
            props["s3.path-style-access"] = "true" if self.s3_path_style else "false"
        if self.s3_anonymous:
            props["s3.anonymous"] = "true"
        return props

    def storage_bounds(self) -> dict[str, str]:
        """File-I/O properties bounding each S3 request by ``LAKE_ICEBERG_S3_TIMEOUT_MS``.

        pyarrow's S3 filesystem (direct reads, manifests, failure probes) honours
        them, so pyiceberg's file I/O is pinned to it: a catalog's config may not
        swap in another implementation with other (or no) timeouts. iceberg-rust's
        reader ignores them and keeps its own fixed I/O timeout.
        """
        seconds = str(self.s3_timeout_s)
        return {
            "py-io-impl": PYARROW_FILE_IO,
            "s3.connect-timeout": seconds,
            "s3.request-timeout": seconds,
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FederationConfig | None:
        """The configuration, None when federation is off; ConfigError when invalid."""
        source = os.environ if env is None else env
        present = [v for v in REQUIRED if _text(source, v) is not None]
        if not present:
            _no_strays(source)
            return None
        missing = [v.name for v in REQUIRED if v not in present]
        if missing:
            raise ConfigError(
                f"Iceberg federation needs {', '.join(v.name for v in REQUIRED)} together; "
                f"missing {', '.join(missing)}"
            )
        endpoint = check_external_url(
            _text(source, ICEBERG_REST_ENDPOINT) or "", ICEBERG_REST_ENDPOINT
        )
        namespaces = _namespaces(_text(source, ICEBERG_NAMESPACES) or "")
        s3_endpoint = _text(source, ICEBERG_S3_ENDPOINT)
        s3_region = _text(source, ICEBERG_S3_REGION)
        if (s3_endpoint is None) != (s3_region is None):
            raise ConfigError(f"{ICEBERG_S3_ENDPOINT} and {ICEBERG_S3_REGION} must be set together")
        if s3_endpoint is not None:
            s3_endpoint = check_external_url(s3_endpoint, ICEBERG_S3_ENDPOINT)
        token, oauth = _auth(source)
        location = _text(source, ICEBERG_LOCATION)
        config = cls(
            endpoint=endpoint,
            warehouse=Secret(_text(source, ICEBERG_WAREHOUSE) or ""),
            namespaces=namespaces,
            timeout_ms=env_int(ICEBERG_REST_TIMEOUT_MS, DEFAULT_TIMEOUT_MS, 100, 300_000, source),
            token=token,
            oauth=oauth,
            s3_endpoint=s3_endpoint,
            s3_region=s3_region,
            s3_path_style=_strict_bool(source, ICEBERG_S3_PATH_STYLE),
            s3_anonymous=bool(_strict_bool(source, ICEBERG_S3_ANONYMOUS)),
            s3_timeout_ms=env_int(
                ICEBERG_S3_TIMEOUT_MS, DEFAULT_S3_TIMEOUT_MS, 100, 300_000, source
            ),
            location=None if location is None else Secret(location),
        )
        config.locations()  # refuse a replica that could not confine what it reads
        return config


_OPTIONAL = (
    ICEBERG_LOCATION,
    ICEBERG_REST_TOKEN,
    ICEBERG_REST_CREDENTIAL,
    ICEBERG_REST_OAUTH2_SERVER_URI,
    ICEBERG_REST_OAUTH_SCOPE,
    ICEBERG_REST_OAUTH_AUDIENCE,
    ICEBERG_REST_OAUTH_RESOURCE,
    ICEBERG_S3_ENDPOINT,
    ICEBERG_S3_REGION,
    ICEBERG_S3_PATH_STYLE,
    ICEBERG_S3_ANONYMOUS,
)


def _no_strays(source: Mapping[str, str]) -> None:
    """An option without the triple is a half-done deployment: refuse it."""
    strays = [v.name for v in _OPTIONAL if _text(source, v) is not None]
    if strays:
        raise ConfigError(f"{', '.join(strays)} set without {', '.join(v.name for v in REQUIRED)}")


def _namespaces(raw: str) -> frozenset[str]:
    names = [part.strip() for part in raw.split(",")]
    if not names or any(not n for n in names):
        raise ConfigError(f"{ICEBERG_NAMESPACES} must be a comma-separated list of namespaces")
    for name in names:
        try:
            validate_identifier(name, "namespace")
        except InvalidName as exc:
            raise ConfigError(f"{ICEBERG_NAMESPACES}: {exc}") from None
    return frozenset(names)


def _auth(source: Mapping[str, str]) -> tuple[Secret | None, OAuthSettings | None]:
    token = _text(source, ICEBERG_REST_TOKEN)
    credential = _text(source, ICEBERG_REST_CREDENTIAL)
    options = {
        v: _text(source, v)
        for v in (
            ICEBERG_REST_OAUTH2_SERVER_URI,
            ICEBERG_REST_OAUTH_SCOPE,
            ICEBERG_REST_OAUTH_AUDIENCE,
            ICEBERG_REST_OAUTH_RESOURCE,
        )
    }
    if token is not None and credential is not None:
        raise ConfigError(
            f"{ICEBERG_REST_TOKEN} and {ICEBERG_REST_CREDENTIAL} are mutually exclusive"
        )
    if credential is None:
        stray = [v.name for v, value in options.items() if value is not None]
        if stray:
            raise ConfigError(f"{', '.join(stray)} require {ICEBERG_REST_CREDENTIAL}")
        return (Secret(token) if token is not None else None), None
    client_id, sep, secret = credential.partition(":")
    if not sep or not client_id or not secret:
        raise ConfigError(f"{ICEBERG_REST_CREDENTIAL} must be client-id:client-secret")
    server_uri = options[ICEBERG_REST_OAUTH2_SERVER_URI]
    if server_uri is not None:
        server_uri = check_external_url(server_uri, ICEBERG_REST_OAUTH2_SERVER_URI)
    return None, OAuthSettings(
        client_id=client_id,
        client_secret=Secret(secret),
        server_uri=server_uri,
        scope=options[ICEBERG_REST_OAUTH_SCOPE] or DEFAULT_SCOPE,
        audience=options[ICEBERG_REST_OAUTH_AUDIENCE],
        resource=options[ICEBERG_REST_OAUTH_RESOURCE],
    )
