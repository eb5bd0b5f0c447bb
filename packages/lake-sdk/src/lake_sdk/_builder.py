"""Deprecated: the 0.1 connection builders and ``connect(url, **kwargs)`` options.

Pass the options to the client instead::

    async with lake_sdk.AsyncClient(url, token=token, ca_pem=ca, server_name="q.internal"):
        ...

:class:`LakeClientBuilder` (``LakeClient.builder(url)``) and
:class:`ClientBuilder` (``lake_sdk.Client.builder(url)``) stay for one
release. Builders are immutable: each ``with_*`` returns a new one. The
token never appears in a ``repr``, an error or a log line.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from lake_core.errors import InvalidArgument
from lake_sdk._schema_cache import (
    DEFAULT_SCHEMA_CACHE_CAPACITY,
    DEFAULT_SCHEMA_CACHE_TTL_S,
    SchemaCache,
)
from lake_sdk._transport import ConnectOptions, check_ca_pem, check_server_name, check_token

if TYPE_CHECKING:
    from lake_sdk._client import LakeClient
    from lake_sdk._sync import Client

__all__ = ["ClientBuilder", "ConnectOptions", "LakeClientBuilder", "connect_kwargs"]

B = TypeVar("B", bound="_Builder")


def connect_kwargs(old: Mapping[str, Any]) -> dict[str, Any]:
    """The client constructor's options for the 0.1 ``connect(url, **kwargs)`` keywords."""
    new = dict(old)
    options = new.pop("options", None) or ConnectOptions()
    if not isinstance(options, ConnectOptions):
        raise InvalidArgument("options must be a ConnectOptions")
    if options.bearer_token is not None:
        new["token"] = options.bearer_token.reveal()
    if options.ca_pem is not None:
        new["ca_pem"] = options.ca_pem
    if options.server_name is not None:
        new["server_name"] = options.server_name
    if "timeout_s" in new:
        new["connect_timeout"] = new.pop("timeout_s")
    if "append_attempts" in new:
        attempts = new.pop("append_attempts")
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 10:
            raise InvalidArgument("append_attempts must be in 1..=10")
        new["retries"] = attempts - 1
    if "schema_cache_capacity" in new or "schema_cache_ttl_s" in new:
        new["schema_cache"] = SchemaCache(
            new.pop("schema_cache_capacity", DEFAULT_SCHEMA_CACHE_CAPACITY),
            new.pop("schema_cache_ttl_s", DEFAULT_SCHEMA_CACHE_TTL_S),
        )
    return new


class _Builder:
    def __init__(
        self,
        url: str,
        options: ConnectOptions | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        connect: Callable[..., Any],
    ) -> None:
        self.url = url
        self._options = options or ConnectOptions()
        self._kwargs: dict[str, Any] = dict(kwargs or {})
        self._connect = connect

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, {self._options!r})"

    def _with(self: B, **changes: Any) -> B:
        options = replace(self._options, **changes)
        return type(self)(self.url, options, self._kwargs, connect=self._connect)

    def _connect_kwargs(self) -> dict[str, Any]:
        return {**self._kwargs, "options": self._options}

    def with_options(self: B, **connect_kwargs: Any) -> B:
        """Any other keyword of the 0.1 ``connect`` (``upload_checkpoint_dir``, ...)."""
        if "options" in connect_kwargs:
            raise InvalidArgument("set credentials and TLS with the builder's with_* methods")
        kwargs = {**self._kwargs, **connect_kwargs}
        return type(self)(self.url, self._options, kwargs, connect=self._connect)

    def with_bearer_token(self: B, token: str) -> B:
        """Send ``authorization: Bearer <token>`` on every call."""
        return self._with(bearer_token=check_token(token))

    def with_ca_certificate_pem(self: B, pem: bytes | str) -> B:
        """Verify Query's certificate against this CA bundle (PEM) instead of system roots."""
        return self._with(ca_pem=check_ca_pem(pem))

    def with_server_name(self: B, name: str) -> B:
        """Expect this name in Query's certificate (when it differs from the URL's host)."""
        return self._with(server_name=check_server_name(name))

    def with_timeout(self: B, seconds: float) -> B:
        """How long :meth:`connect` waits for Query to answer (default 10 s)."""
        return self.with_options(timeout_s=seconds)

    def with_append_attempts(self: B, attempts: int) -> B:
        """Attempts per append on ambiguous transport failures (1..=10, default 3)."""
        return self.with_options(append_attempts=attempts)

    def with_upload_checkpoint_dir(self: B, path: str | os.PathLike[str]) -> B:
        """Make path-backed FILE uploads restart-resumable."""
        return self.with_options(upload_checkpoint_dir=path)

    def with_schema_cache(self: B, capacity: int, ttl_s: float) -> B:
        """Size and lifetime of the client's table-schema cache."""
        return self.with_options(schema_cache_capacity=capacity, schema_cache_ttl_s=ttl_s)


class LakeClientBuilder(_Builder):
    """Deprecated: builds an async client; pass the options to :class:`lake_sdk.AsyncClient`."""

    def connect(self) -> Awaitable[LakeClient]:
        result: Awaitable[LakeClient] = self._connect(self.url, **self._connect_kwargs())
        return result

    def connect_query_only(self) -> Awaitable[LakeClient]:
        """A client without storage access: FILE reads go through Query-issued capabilities."""
        return self.with_options(query_only=True).connect()


class ClientBuilder(_Builder):
    """Deprecated: builds a blocking client; pass the options to :class:`lake_sdk.Client`."""

    def connect(self) -> Client:
        client: Client = self._connect(self.url, **self._connect_kwargs())
        return client

    def connect_query_only(self) -> Client:
        """A client without storage access: FILE reads go through Query-issued capabilities."""
        return self.with_options(query_only=True).connect()
