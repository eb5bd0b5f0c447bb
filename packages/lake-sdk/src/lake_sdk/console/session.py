"""Sign-in state: the principal's token in a cookie, CSRF tokens, SDK clients per principal.

The cookie ``lake_session`` holds the token the principal signed in with,
base64url-encoded (HttpOnly, SameSite=Strict, Path=/, Secure when the console serves TLS); it
is never put in a URL, a page or a log line. A CSRF token is an HMAC of the
session under the process's secret: every state-changing request (POST)
must carry it in its ``csrf`` field. Before sign-in, a random
``lake_presession`` cookie plays the session's part, so the sign-in form is
protected the same way.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
from collections import OrderedDict

from starlette.requests import Request
from starlette.responses import Response

from lake_sdk._client import AsyncClient
from lake_sdk.console.settings import MAX_CLIENTS, ConsoleSettings

__all__ = [
    "PRESESSION_COOKIE",
    "SESSION_COOKIE",
    "Clients",
    "csrf_ok",
    "csrf_token",
    "presession_value",
    "session_value",
    "set_cookie",
    "set_session_cookie",
]

SESSION_COOKIE = "lake_session"
PRESESSION_COOKIE = "lake_presession"
#: The session value of a principal who signed in without a token (a development Query).
_NO_TOKEN = "-"


def session_value(request: Request) -> str | None:
    """The session (the token, ``-`` for none) its cookie holds, or None when not signed in."""
    value = request.cookies.get(SESSION_COOKIE)
    if not value:
        return None
    try:
        session = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None  # not a cookie this console set: signed out
    return session or None


def set_session_cookie(response: Response, settings: ConsoleSettings, session: str) -> None:
    """Keep ``session`` in the session cookie, base64url-encoded.

    A token may hold any visible ASCII character (docs/security.md), and
    ``; , " \\`` cannot stand in a cookie value as they are: encoded, every
    valid token can sign in.
    """
    value = base64.urlsafe_b64encode(session.encode("ascii")).decode().rstrip("=")
    set_cookie(response, settings, SESSION_COOKIE, value)


def presession_value(request: Request) -> str | None:
    """The sign-in form's random cookie, the sign-in POST's CSRF basis."""
    return request.cookies.get(PRESESSION_COOKIE) or None


def token_of(session: str) -> str | None:
    return None if session == _NO_TOKEN else session


def session_for(token: str) -> str:
    return token if token else _NO_TOKEN


def csrf_token(settings: ConsoleSettings, basis: str) -> str:
    """The CSRF token for a session (or presession) value."""
    return hmac.new(settings.secret, b"csrf\0" + basis.encode(), hashlib.sha256).hexdigest()


def csrf_ok(settings: ConsoleSettings, basis: str | None, offered: str | None) -> bool:
    if not basis or not offered:
        return False
    # As bytes: compare_digest refuses str holding non-ASCII (anyone may post anything).
    return hmac.compare_digest(csrf_token(settings, basis).encode(), offered.encode())


def new_presession() -> str:
    return secrets.token_urlsafe(24)


def set_cookie(response: Response, settings: ConsoleSettings, name: str, value: str) -> None:
    response.set_cookie(
        name, value, httponly=True, samesite="strict", secure=settings.https, path="/"
    )


def clear_cookie(response: Response, settings: ConsoleSettings, name: str) -> None:
    response.delete_cookie(name, httponly=True, samesite="strict", secure=settings.https, path="/")


class Clients:
    """One open :class:`AsyncClient` per signed-in token (at most ``MAX_CLIENTS``, LRU)."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self._settings = settings
        self._open: OrderedDict[str, AsyncClient] = OrderedDict()
        self._lock = asyncio.Lock()

    @staticmethod
    def _key(session: str) -> str:
        return hashlib.sha256(session.encode()).hexdigest()

    async def get(self, session: str) -> AsyncClient:
        """The principal's client, connected (raises the SDK's error if Query refuses it)."""
        key = self._key(session)
        async with self._lock:
            client = self._open.get(key)
            if client is not None:
                self._open.move_to_end(key)
                return client
            s = self._settings
            client = AsyncClient(
                s.query_url,
                token=token_of(session),
                ca_pem=s.ca_pem,
                server_name=s.server_name,
                connect_timeout=s.connect_timeout,
                progress=False,
            )
            await client.__aenter__()
            self._open[key] = client
            while len(self._open) > MAX_CLIENTS:
                _, old = self._open.popitem(last=False)
                await old.close()
            return client

    async def forget(self, session: str) -> None:
        async with self._lock:
            client = self._open.pop(self._key(session), None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        async with self._lock:
            clients = list(self._open.values())
            self._open.clear()
        for client in clients:
            await client.close()
