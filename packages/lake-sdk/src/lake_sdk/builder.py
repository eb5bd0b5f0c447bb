"""Connection builders: TLS verification and a bearer token for every Flight call.

    client = await (
        LakeClient.builder("https://query.internal:50051")
        .with_bearer_token(Path("/run/secrets/query-token").read_text().strip())
        .with_ca_certificate_pem(Path("/run/tls/ca.crt").read_bytes())
        .with_server_name("query.internal")
        .connect()
    )

:class:`ClientBuilder` (``lake_sdk.Client.builder(url)``) is the blocking
twin. Builders are immutable: each ``with_*`` returns a new one. The token is
sent as ``authorization: Bearer ...`` on every RPC (SQL, schema lookups,
appends, discovery) and never appears in a ``repr``, an error or a log line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow.flight as flight

from lake_core.auth import Secret
from lake_core.errors import InvalidArgument
from lake_sdk._errors import TrailerCapture

if TYPE_CHECKING:
    from lake_sdk.client import LakeClient
    from lake_sdk.sync import Client

__all__ = ["ClientBuilder", "ConnectOptions", "LakeClientBuilder"]

B = TypeVar("B", bound="_Builder")

_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")
_SERVER_NAME = re.compile(r"[A-Za-z0-9.-]{1,253}|[0-9A-Fa-f:.]{2,45}")
_TLS_SCHEMES = ("https://", "grpc+tls://")


class _BearerMiddleware(flight.ClientMiddleware):  # type: ignore[misc]
    def __init__(self, header: str) -> None:
        self._header = header

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": self._header}

    def __repr__(self) -> str:
        return "_BearerMiddleware(***)"


class _BearerFactory(flight.ClientMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, token: Secret) -> None:
        self._token = token

    def start_call(self, info: Any) -> _BearerMiddleware:
        return _BearerMiddleware(f"Bearer {self._token.reveal()}")

    def __repr__(self) -> str:
        return "_BearerFactory(***)"


@dataclass(frozen=True, repr=False)
class ConnectOptions:
    """How the SDK reaches Query: credentials and TLS verification."""

    bearer_token: Secret | None = None
    ca_pem: bytes | None = None
    server_name: str | None = None

    def __repr__(self) -> str:
        token = "***" if self.bearer_token is not None else None
        ca = "<pem>" if self.ca_pem is not None else None
        return (
            f"ConnectOptions(bearer_token={token}, ca_pem={ca}, server_name={self.server_name!r})"
        )

    def flight_client(self, url: str, location: str) -> flight.FlightClient:
        """A pyarrow FlightClient for ``location`` (``url`` as the caller wrote it)."""
        tls = url.startswith(_TLS_SCHEMES)
        if not tls and (self.ca_pem is not None or self.server_name is not None):
            raise InvalidArgument(
                f"a CA certificate or server name needs a TLS endpoint (https://), got {url!r}"
            )
        middleware: list[flight.ClientMiddlewareFactory] = [TrailerCapture()]
        kwargs: dict[str, Any] = {"middleware": middleware}
        if self.ca_pem is not None:
            kwargs["tls_root_certs"] = self.ca_pem
        if self.server_name is not None:
            kwargs["override_hostname"] = self.server_name
        if self.bearer_token is not None:
            middleware.append(_BearerFactory(self.bearer_token))
        return flight.FlightClient(location, **kwargs)


class _Builder:
    def __init__(
        self,
        url: str,
        options: ConnectOptions | None = None,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        self._options = options or ConnectOptions()
        self._kwargs: dict[str, Any] = dict(connect_kwargs or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, {self._options!r})"

    def _with(self: B, **changes: Any) -> B:
        return type(self)(self.url, replace(self._options, **changes), self._kwargs)

    def with_options(self: B, **connect_kwargs: Any) -> B:
        """Any other keyword of :meth:`LakeClient.connect` (``upload_checkpoint_dir``, ...)."""
        if "options" in connect_kwargs:
            raise InvalidArgument("set credentials and TLS with the builder's with_* methods")
        return type(self)(self.url, self._options, {**self._kwargs, **connect_kwargs})

    def with_bearer_token(self: B, token: str) -> B:
        """Send ``authorization: Bearer <token>`` on every call."""
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            # The value is never echoed: it may be a real credential.
            raise InvalidArgument("a bearer token must be visible ASCII without spaces")
        return self._with(bearer_token=Secret(token))

    def with_ca_certificate_pem(self: B, pem: bytes | str) -> B:
        """Verify Query's certificate against this CA bundle (PEM) instead of system roots."""
        data = pem.encode() if isinstance(pem, str) else bytes(pem)
        if b"-----BEGIN CERTIFICATE-----" not in data:
            raise InvalidArgument("the CA certificate must be PEM text (BEGIN CERTIFICATE)")
        return self._with(ca_pem=data)

    def with_server_name(self: B, name: str) -> B:
        """Expect this name in Query's certificate (when it differs from the URL's host)."""
        if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
            raise InvalidArgument(f"server name must be a DNS name or IP address, got {name!r}")
        return self._with(server_name=name)

    def with_timeout(self: B, seconds: float) -> B:
        """How long :meth:`connect` waits for Query to answer (default 10 s)."""
        return self.with_options(timeout_s=seconds)

    def with_append_attempts(self: B, attempts: int) -> B:
        """Attempts per append on ambiguous transport failures (1..=10, default 3)."""
        return self.with_options(append_attempts=attempts)

    def with_upload_checkpoint_dir(self: B, path: str | os.PathLike[str]) -> B:
        """Make path-backed FILE uploads restart-resumable (see :mod:`lake_sdk`)."""
        return self.with_options(upload_checkpoint_dir=path)

    def with_schema_cache(self: B, capacity: int, ttl_s: float) -> B:
        """Size and lifetime of the client's table-schema cache."""
        return self.with_options(schema_cache_capacity=capacity, schema_cache_ttl_s=ttl_s)


class LakeClientBuilder(_Builder):
    """Builds an async :class:`~lake_sdk.LakeClient`; see the module docstring."""

    async def connect(self) -> LakeClient:
        from lake_sdk.client import LakeClient

        return await LakeClient.connect(self.url, options=self._options, **self._kwargs)

    async def connect_query_only(self) -> LakeClient:
        """A client without storage access: FILE reads go through Query-issued capabilities."""
        return await self.with_options(query_only=True).connect()


class ClientBuilder(_Builder):
    """Builds a blocking :class:`~lake_sdk.Client`; see the module docstring."""

    def connect(self) -> Client:
        from lake_sdk.sync import connect

        return connect(self.url, options=self._options, **self._kwargs)

    def connect_query_only(self) -> Client:
        """A client without storage access: FILE reads go through Query-issued capabilities."""
        return self.with_options(query_only=True).connect()
