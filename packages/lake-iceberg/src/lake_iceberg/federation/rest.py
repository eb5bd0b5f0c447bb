"""A bounded, read-only Iceberg REST catalog client.

Only the exchanges federation needs, each under the one configured timeout:
the ``/v1/config`` handshake, namespace point checks (HEAD), exact table loads
(GET) and OAuth2 client-credential token requests (POST to the token
endpoint). No listing, no commit: the client has no method that could
enumerate or mutate the external catalog.

OAuth: when the catalog refuses a token (401/419), one renewal runs for every
reader that saw the refusal of that token (single flight), and each retries
once. A failed renewal is shared the same way; a leader interrupted mid-renewal
hands its followers the same failure instead of stranding them. Static tokens
are never renewed.

Failures are typed (:class:`~lake_core.errors.Unavailable` for an unreachable,
stalled or failing catalog) and name neither the warehouse, the URL's
credentials nor a token.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
import urllib3

from lake_core.errors import Unavailable
from lake_iceberg.federation.config import FederationConfig
from lake_iceberg.federation.counters import FederationCounters, NullCounters

__all__ = ["CatalogRefused", "LoadedTable", "RestClient"]

_REFUSED_TOKEN = frozenset({401, 419})

#: The largest answer read from the catalog or its token endpoint. requests'
#: timeout bounds each socket read, not the body: a catalog dripping a byte
#: per second, or streaming gigabytes, would otherwise hold a planner (and its
#: memory) long past the configured timeout.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_CHUNK = 64 * 1024


class CatalogRefused(Unavailable):
    """The external catalog answered with an error status (the status is kept)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LoadedTable:
    """One exact table load: the metadata document and the catalog's file-I/O config."""

    metadata_location: str
    metadata: Mapping[str, Any]
    config: Mapping[str, str]


class _Token:
    """The current OAuth token and the one renewal in flight, if any."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.generation = 0
        self.pending: Future[None] | None = None
        #: Failed renewals so far, and the last one's error: a reader whose request
        #: went out before a renewal failed shares that failure instead of starting
        #: another exchange (its 401 may arrive after the leader has finished).
        self.failures = 0
        self.failure: BaseException | None = None
        self.lock = threading.Lock()


class RestClient:
    """Read-only REST calls against one configured catalog (thread-safe)."""

    def __init__(
        self,
        config: FederationConfig,
        *,
        counters: FederationCounters | None = None,
        session: requests.Session | None = None,
    ) -> None:
        self._config = config
        self._counters = counters or NullCounters()
        self._session = session or requests.Session()
        self._session.trust_env = False  # no proxy or netrc credentials from the environment
        self._prefix: str | None = None
        self._token = _Token()
        self._timeout = (config.timeout_s, config.timeout_s)

    def __repr__(self) -> str:
        return f"RestClient(endpoint={self._config.endpoint!r})"

    def close(self) -> None:
        self._session.close()

    # -- public calls ---------------------------------------------------------

    def handshake(self) -> None:
        """``GET /v1/config``: learn the catalog's path prefix for the warehouse."""
        body = self._json("GET", "/v1/config", params={"warehouse": self._warehouse()})
        overrides = body.get("overrides") or {}
        defaults = body.get("defaults") or {}
        prefix = overrides.get("prefix", defaults.get("prefix"))
        self._prefix = str(prefix).strip("/") if prefix else ""

    def namespace_exists(self, namespace: str) -> bool:
        status, _ = self._call("HEAD", self._path("namespaces", namespace), allow={404})
        return status != 404

    def load_table(self, namespace: str, table: str) -> LoadedTable | None:
        """The table's current metadata, or None when it does not exist."""
        status, response = self._call(
            "GET", self._path("namespaces", namespace, "tables", table), allow={404}
        )
        if status == 404 or response is None:
            return None
        try:
            body = self._decode(response)
        except ValueError:
            raise Unavailable("the Iceberg catalog sent a malformed table load") from None
        try:
            location = str(body["metadata-location"])
            metadata = body["metadata"]
            config = {str(k): str(v) for k, v in (body.get("config") or {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Unavailable("the Iceberg catalog sent a malformed table load") from None
        if not isinstance(metadata, dict):
            raise Unavailable("the Iceberg catalog sent a malformed table load")
        return LoadedTable(location, metadata, config)

    # -- plumbing -------------------------------------------------------------

    def _warehouse(self) -> str:
        return self._config.warehouse.reveal()

    def _path(self, *parts: str) -> str:
        if self._prefix is None:
            self.handshake()
        segments = [self._prefix] if self._prefix else []
        segments += [quote(p, safe="") for p in parts]
        return "/v1/" + "/".join(segments)

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        _, response = self._call(method, path, **kwargs)
        try:
            body = self._decode(response) if response is not None else {}
        except ValueError:
            raise Unavailable("the Iceberg catalog sent malformed JSON") from None
        return body if isinstance(body, dict) else {}

    def _decode(self, response: requests.Response) -> Any:
        """The JSON body, read within one timeout and :data:`MAX_ANSWER_BYTES`.

        ValueError for JSON that does not parse (or nests too deep to);
        Unavailable for a body too slow or too large.
        """
        deadline = time.monotonic() + self._config.timeout_s
        body = bytearray()
        try:
            # read1: whatever one socket read brings, so the deadline is checked
            # as bytes trickle in (read(n) would wait for all n of them).
            while chunk := response.raw.read1(_CHUNK, decode_content=True):
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise Unavailable("the Iceberg catalog sent an answer over 64 MiB")
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"the Iceberg catalog did not answer within {self._config.timeout_ms} ms"
                    )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(
                f"the Iceberg catalog's answer broke off ({type(exc).__name__})"
            ) from None
        finally:
            response.close()
        try:
            return json.loads(body)
        except RecursionError:
            raise ValueError("nested too deep") from None

    def _call(
        self,
        method: str,
        path: str,
        *,
        allow: frozenset[int] | set[int] = frozenset(),
        **kwargs: Any,
    ) -> tuple[int, requests.Response | None]:
        generation, token = self._bearer()
        failures = self._token.failures
        response = self._send(method, path, token, **kwargs)
        if response.status_code in _REFUSED_TOKEN and self._config.oauth is not None:
            response.close()
            self._renew(generation, failures=failures)
            _, token = self._bearer()
            response = self._send(method, path, token, **kwargs)
        status = response.status_code
        if 200 <= status < 300 and status not in allow:
            return status, response
        response.close()  # streamed: nothing of it is read
        if status in allow:
            return status, None
        raise CatalogRefused(f"the Iceberg catalog answered {method} with HTTP {status}", status)

    def _send(self, method: str, path: str, token: str | None, **kwargs: Any) -> requests.Response:
        headers = {"Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            return self._session.request(
                method,
                self._config.endpoint + path,
                headers=headers,
                timeout=self._timeout,
                allow_redirects=False,
                stream=True,  # the body is read by _decode, bounded
                **kwargs,
            )
        except requests.Timeout:
            raise Unavailable(
                f"the Iceberg catalog did not answer within {self._config.timeout_ms} ms"
            ) from None
        except requests.RequestException as exc:
            raise Unavailable(
                f"the Iceberg catalog is unreachable ({type(exc).__name__})"
            ) from None

    def _bearer(self) -> tuple[int, str | None]:
        if self._config.token is not None:
            return 0, self._config.token.reveal()
        if self._config.oauth is None:
            return 0, None
        state = self._token
        with state.lock:
            if state.value is not None:
                return state.generation, state.value
            generation = state.generation
        self._renew(generation, first=True)
        with state.lock:
            return state.generation, state.value

    def _renew(self, seen: int, *, first: bool = False, failures: int | None = None) -> None:
        """Replace the token refused at generation ``seen``: one exchange for all its readers.

        ``failures``: the failed-renewal count when the refused request was sent;
        a renewal of the same token that failed since then is this reader's answer too.
        """
        state = self._token
        with state.lock:
            if state.generation > seen and state.value is not None:
                return  # someone already renewed it
            if (
                failures is not None
                and state.failures > failures
                and state.generation == seen
                and state.failure is not None
            ):
                raise state.failure
            pending = state.pending
            leader = pending is None
            if leader:
                pending = state.pending = Future()
        assert pending is not None
        if not leader:
            pending.result()  # the leader's outcome, success or failure
            return
        try:
            if not first:
                self._counters.oauth_renewal()
            token = self._exchange()
        except BaseException as exc:
            failure = (
                exc
                if isinstance(exc, Unavailable)
                else Unavailable("the Iceberg catalog token renewal was abandoned")
            )
            with state.lock:
                state.pending = None
                state.failures += 1
                state.failure = failure
            pending.set_exception(failure)
            raise
        with state.lock:
            state.value = token
            state.generation += 1
            state.pending = None
        pending.set_result(None)

    def _exchange(self) -> str:
        oauth = self._config.oauth
        assert oauth is not None
        form = {
            "grant_type": "client_credentials",
            "client_id": oauth.client_id,
            "client_secret": oauth.client_secret.reveal(),
            "scope": oauth.scope,
        }
        if oauth.audience:
            form["audience"] = oauth.audience
        if oauth.resource:
            form["resource"] = oauth.resource
        url = oauth.server_uri or self._config.endpoint + "/v1/oauth/tokens"
        try:
            response = self._session.post(
                url, data=form, timeout=self._timeout, allow_redirects=False, stream=True
            )
        except requests.Timeout:
            raise Unavailable(
                f"the Iceberg token endpoint did not answer within {self._config.timeout_ms} ms"
            ) from None
        except requests.RequestException as exc:
            raise Unavailable(
                f"the Iceberg token endpoint is unreachable ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            response.close()
            raise CatalogRefused(
                f"the Iceberg token endpoint answered HTTP {response.status_code}",
                response.status_code,
            )
        try:
            return str(self._decode(response)["access_token"])
        except (ValueError, KeyError, TypeError):
            raise Unavailable("the Iceberg token endpoint sent a malformed answer") from None
