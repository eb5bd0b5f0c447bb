"""A signed-in HTTP session of the console without a browser (urllib, a cookie jar)."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from email.message import Message


@dataclass
class Reply:
    status: int
    headers: Message
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Session:
    base: str
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)

    def __post_init__(self) -> None:
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )

    def request(
        self, path: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        try:
            with self.opener.open(request, timeout=120) as reply:
                return Reply(reply.status, reply.headers, reply.read())
        except urllib.error.HTTPError as error:
            return Reply(error.code, error.headers, error.read())

    def csrf(self, path: str) -> str:
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', self.request(path).text)
        assert match is not None, f"no CSRF field on {path}"
        return match[1]

    def sign_in(self, token: str) -> Reply:
        reply = self.request("/signin", {"csrf": self.csrf("/signin"), "token": token})
        assert reply.status == 303, reply.text[:500]
        return reply
