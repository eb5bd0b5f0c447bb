"""An HTTP(S) front for an Iceberg REST catalog that checks auth and injects faults.

It forwards every request to the upstream catalog and can, as the tests ask:

- terminate TLS with a test CA's certificate (``server_cert``), and require a
  client certificate from ``client_ca`` (mutual TLS);
- require ``Authorization: Bearer <require_token>`` on every catalog call, or
  (``require_issued_token``) a token that its own ``/v1/oauth/tokens`` (the
  upstream's, forwarded) issued;
- answer the token endpoint with 401 (``token_status``);
- apply a table commit upstream and then lose its response
  (``lose_commit_responses``: that many times, the connection is closed
  instead of answering);
- answer 503 to the next ``fail_requests`` requests;
- answer 401 to the next ``expire_tokens`` catalog requests, as when an
  access token has just expired;
- answer ``fail_status`` (503 by default) to the next ``fail_requests``;
- never answer the next ``stall_requests`` catalog requests (until ``stop()``);
- hold every token request while ``hold_tokens`` is set, until ``release_tokens()``.

``wait_requests(kind, n)`` blocks until the proxy has seen ``n`` requests of
``kind`` (``"token"``, ``"commit"`` or the HTTP method), so tests wait on the
event itself rather than on a sleep.

Runs its own event loop on a thread; ``stop()`` closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import select
import socket
import ssl
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from tools.lake_testing.servers import free_port
from tools.lake_testing.tls import ServerCert

__all__ = ["CatalogProxy"]

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host"}
_COMMIT = re.compile(r"^/v1/(?:[^/]+/)?namespaces/[^/]+/tables/[^/]+$")
_TOKENS = "/v1/oauth/tokens"


def _error(status: int, kind: str, message: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status)


@dataclass
class CatalogProxy:
    upstream: str
    port: int = field(default_factory=free_port)
    server_cert: ServerCert | None = None
    client_ca: Path | None = None
    require_token: str | None = None
    require_issued_token: bool = False
    token_status: int | None = None
    lose_commit_responses: int = 0
    fail_requests: int = 0
    expire_tokens: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    issued: set[str] = field(default_factory=set)
    http_port: int = field(default_factory=free_port)
    fail_status: int = 503
    stall_requests: int = 0
    hold_tokens: bool = False

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.server_cert is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def wait_requests(self, kind: str, count: int, timeout_s: float = 60.0) -> None:
        """Block until ``count`` requests of ``kind`` have arrived."""
        with self._seen:
            if not self._seen.wait_for(lambda: self.requests[kind] >= count, timeout_s):
                raise TimeoutError(f"{self.requests[kind]} {kind} requests, expected {count}")

    def _thread_done(self) -> bool:
        return not self._thread.is_alive()

    def release_tokens(self) -> None:
        self.hold_tokens = False
        self._loop.call_soon_threadsafe(self._tokens_released.set)

    def start(self) -> CatalogProxy:
        self._seen = threading.Condition()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise TimeoutError("catalog proxy did not start")
        self._tls: _TlsFront | None = None
        context = self._ssl()
        if context is not None:
            self._tls = _TlsFront(context, self.port, self.http_port).start()
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        ready.set()
        self._loop.run_forever()

    def _ssl(self) -> ssl.SSLContext | None:
        if self.server_cert is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert.cert_file, self.server_cert.key_file)
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.client_ca))
        return context

    async def _serve(self) -> None:
        self._tokens_released = asyncio.Event()
        self._stalled = asyncio.Event()  # never set: stalled requests wait for stop()
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        plain = self.port if self.server_cert is None else self.http_port
        site = web.TCPSite(self._runner, "127.0.0.1", plain)
        await site.start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.rel_url.path
        kind = (
            "token"
            if path == _TOKENS
            else "commit"
            if (request.method == "POST" and _COMMIT.match(path))
            else request.method
        )
        with self._seen:
            self.requests[kind] += 1
            self._seen.notify_all()
        if kind == "token" and self.hold_tokens:
            await self._tokens_released.wait()
        if kind != "token" and self.stall_requests > 0:
            self.stall_requests -= 1
            await self._stalled.wait()
        if self.fail_requests > 0:
            self.fail_requests -= 1
            status = self.fail_status
            return _error(status, "ServiceUnavailableException", f"injected {status}")
        if kind == "token" and self.token_status is not None:
            return web.json_response(
                {"error": "invalid_client", "error_description": "injected"},
                status=self.token_status,
            )
        if kind != "token" and self.expire_tokens > 0:
            self.expire_tokens -= 1
            self.issued.clear()
            return _error(401, "NotAuthorizedException", "injected: the token expired")
        if kind != "token" and not self._authorized(request):
            return _error(401, "NotAuthorizedException", "the front refused the credentials")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=body if body else None,
            allow_redirects=False,
        ) as upstream:
            payload = await upstream.read()
            if kind == "token" and upstream.status == 200:
                self.issued.add(str(json.loads(payload).get("access_token", "")))
            if kind == "commit" and self.lose_commit_responses > 0:
                self.lose_commit_responses -= 1
                # The catalog applied the commit; its answer never arrives.
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
            out = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in _HOP | {"content-length"}
            }
            return web.Response(status=upstream.status, body=payload, headers=out)

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else None
        if self.require_token is not None and token != self.require_token:
            return False
        return not (self.require_issued_token and token not in self.issued)

    def stop(self) -> None:
        if not hasattr(self, "_loop") or self._loop.is_closed() or self._thread_done():
            return  # never started, or already stopped
        tls = getattr(self, "_tls", None)
        if tls is not None:
            tls.stop()

        async def close() -> None:
            self._stalled.set()
            self._tokens_released.set()
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class _TlsFront:
    """TLS termination on blocking sockets, in threads, forwarding plaintext to ``backend``.

    Blocking OpenSSL sockets send their alerts (certificate required, unknown
    CA) before closing, as a real TLS server does; asyncio's SSL transport may
    close without flushing them.
    """

    def __init__(self, context: ssl.SSLContext, port: int, backend: int) -> None:
        self.context = context
        self.backend = backend
        self.listener = socket.create_server(("127.0.0.1", port))
        self.closed = threading.Event()

    def start(self) -> _TlsFront:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(30)
        tls = self.context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except (OSError, ssl.SSLError):
            _linger(tls)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.backend), timeout=30)
        except OSError:
            tls.close()
            return
        try:
            self._pump(tls, upstream)
        finally:
            for end in (tls, upstream):
                with contextlib.suppress(OSError):
                    end.close()

    def _pump(self, tls: ssl.SSLSocket, upstream: socket.socket) -> None:
        ends = [tls, upstream]
        while not self.closed.is_set():
            readable = [tls] if tls.pending() else []
            if not readable:
                readable, _, _ = select.select(ends, [], [], 1.0)
            for end in readable:
                other = upstream if end is tls else tls
                try:
                    data = end.recv(65536)
                except (OSError, ssl.SSLError):
                    return
                if not data:
                    return
                other.sendall(data)

    def stop(self) -> None:
        self.closed.set()
        self.listener.close()


def _linger(raw: socket.socket) -> None:
    """Close after a failed handshake without a reset, so the client reads the alert.

    Closing a socket with unread input (the client's request) sends RST,
    which can discard the alert before the client reads it.
    """
    try:
        raw.shutdown(socket.SHUT_WR)
        raw.settimeout(5)
        while raw.recv(65536):
            pass
    except OSError:
        pass
    finally:
        raw.close()
