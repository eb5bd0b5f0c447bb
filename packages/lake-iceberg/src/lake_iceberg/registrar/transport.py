"""The HTTP transport under pyiceberg's REST client: pinned trust roots and timeouts.

requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` override a session's
``verify``, which would quietly trust the platform roots again when
``catalog_ca_file`` should be the only CA. The adapter here applies the
configured CA and client certificate to every request itself, and a default
timeout (pyiceberg sets none, so a stalled catalog would hang forever).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog.rest import RestCatalog
from requests import PreparedRequest, Response, Session
from requests.adapters import HTTPAdapter

__all__ = ["CATALOG_TIMEOUT", "RegistrarCatalog"]

#: (connect, read) seconds for every catalog and token-endpoint request.
CATALOG_TIMEOUT = (10.0, 120.0)


class _PinnedAdapter(HTTPAdapter):
    def __init__(self, ca_file: str | None, client: tuple[str, str] | None) -> None:
        super().__init__()
        self._ca_file = ca_file
        self._client = client

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> Response:
        if self._ca_file is not None:
            verify = self._ca_file
        if self._client is not None:
            cert = self._client
        return super().send(
            request,
            stream=stream,
            timeout=timeout if timeout is not None else CATALOG_TIMEOUT,
            verify=verify,
            cert=cert,
            proxies=proxies,
        )


class RegistrarCatalog(RestCatalog):
    """pyiceberg's REST catalog with the registrar's transport on every session."""

    def _mount(self, session: Session) -> None:
        ssl = self.properties.get("ssl") or {}
        client = ssl.get("client") or {}
        pair = (client["cert"], client["key"]) if "cert" in client and "key" in client else None
        session.mount("https://", _PinnedAdapter(ssl.get("cabundle"), pair))
        session.mount("http://", _PinnedAdapter(None, None))

    def _create_legacy_oauth2_auth_manager(self, session: Session) -> Any:
        # Called inside _create_session before the first token exchange: the
        # exchange must already go through the pinned transport.
        self._mount(session)
        return super()._create_legacy_oauth2_auth_manager(session)

    def _create_session(self) -> Session:
        session = super()._create_session()
        self._mount(session)
        return session
