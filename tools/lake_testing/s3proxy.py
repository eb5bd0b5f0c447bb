"""An HTTP proxy in front of a real S3 server that counts requests and injects faults.

Requests are forwarded unchanged (the Host header included, so SigV4
signatures made for the proxy's address still verify upstream). Faults
rewrite the upstream's real response:

- ``"bad_content_range"``: a 206's Content-Range names other bytes;
- ``"ignore_range"``: a 206 becomes a 200 without Content-Range, as from a
  proxy that dropped the Range header;
- ``"redirect"``: every answer is a 302 to another location;
- ``"unavailable"``: every answer is S3's 503 ServiceUnavailable (an
  outage), without asking the upstream;
- ``"stall"``: the connection is accepted and the request read, but no
  answer ever comes (a silent store);
- ``"stall_body"``: the upstream's status and headers, then the first few
  bytes of the body, then silence;
- ``"trickle"``: the upstream's answer, its body sent in 16 slivers
  ``trickle_gap_s`` apart (a slow link that keeps moving);
- ``"garble"``: a GET's body keeps its length but its second half becomes
  0xFF bytes (an object damaged at rest);
- ``"stall_upload"``: a PUT's body is read for ``upload_stall_after`` bytes,
  then no more (a store whose TCP window stays shut mid-upload); with 0, not
  even its ``Expect: 100-continue`` is answered;
- ``"slow_upload"``: a PUT's first ``upload_slow_bytes`` are read
  ``upload_step`` bytes at a time, ``upload_gap_s`` apart (a slow uplink
  that keeps moving), the rest at once, then it is forwarded.

``fault_paths``: when set, the fault hits only requests whose path contains
it (``".parquet"``: data files only); every other request is forwarded.
Stalled requests are counted in ``stalled`` and released by ``stop()``.

Runs its own event loop on a thread; ``stop()`` closes it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from tools.lake_testing.servers import free_port

__all__ = ["S3Proxy"]

_UNAVAILABLE = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
    b"<Message>Service is unable to handle request.</Message></Error>"
)
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class S3Proxy:
    upstream: str
    port: int = field(default_factory=free_port)
    fault: str | None = None
    fault_paths: str | None = None
    requests: Counter[str] = field(default_factory=Counter)
    #: Requests a stall fault is holding (or held) unanswered.
    stalled: int = 0
    #: The pause between the slivers of a ``"trickle"`` body.
    trickle_gap_s: float = 0.25
    #: SO_RCVBUF of the proxy's sockets (None: the kernel's autotuning). A small
    #: one keeps a stalled upload's body in the sender instead of this side's kernel.
    recv_buffer: int | None = None
    #: Body bytes a ``"stall_upload"`` reads before it stops reading.
    upload_stall_after: int = 256 * 1024
    #: The bytes a ``"slow_upload"`` reads at a time, and the pause between reads.
    upload_step: int = 64 * 1024
    upload_gap_s: float = 0.05
    upload_slow_bytes: int = 1024 * 1024
    #: Requests per (method, object path): what a failure probe's cap is counted by.
    paths: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def start(self) -> S3Proxy:
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        ready.set()
        self._loop.run_forever()

    async def _serve(self) -> None:
        self._released = asyncio.Event()  # set by stop(): stalled requests end
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{path:.*}", self._handle, expect_handler=self._expect)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        if self.recv_buffer is None:
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.recv_buffer)
        listener.bind(("127.0.0.1", self.port))
        await web.SockSite(self._runner, listener).start()

    async def _expect(self, request: web.Request) -> None:
        """Answer ``Expect: 100-continue``, unless a ``"stall_upload"`` of 0 bytes holds it."""
        if self.fault == "stall_upload" and request.method == "PUT" and not self.upload_stall_after:
            self.stalled += 1
            await self._released.wait()
            raise web.HTTPServiceUnavailable()
        await _default_expect_handler(request)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests[request.method] += 1
        self.paths[request.method, request.path] += 1
        fault = self.fault
        if self.fault_paths is not None and self.fault_paths not in request.path:
            fault = None
        if fault == "redirect":
            raise web.HTTPFound("http://127.0.0.1:9/elsewhere")
        if fault == "unavailable":
            return web.Response(status=503, body=_UNAVAILABLE, content_type="application/xml")
        if fault == "stall":
            self.stalled += 1
            await request.read()
            await self._released.wait()
            raise web.HTTPServiceUnavailable()
        if fault == "stall_upload" and request.method == "PUT":
            self.stalled += 1
            await request.content.readexactly(
                min(self.upload_stall_after, request.content_length or 0)
            )
            await self._released.wait()
            assert request.transport is not None
            request.transport.close()  # the rest of the body is never read
            raise web.HTTPServiceUnavailable()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        if fault == "slow_upload" and request.method == "PUT":
            body = await self._read_slowly(request)
        else:
            body = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=body if body else None,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as upstream:
            payload = await upstream.read()
            out_headers = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in _HOP and k.lower() != "content-length"
            }
            status = upstream.status
            if status == 206 and self.fault == "bad_content_range":
                start, _, rest = out_headers["Content-Range"].removeprefix("bytes ").partition("-")
                end, _, size = rest.partition("/")
                out_headers["Content-Range"] = f"bytes {int(start) + 1}-{int(end) + 1}/{size}"
            if status == 206 and self.fault == "ignore_range":
                status = 200
                out_headers.pop("Content-Range", None)
            if request.method == "HEAD":
                out_headers["Content-Length"] = upstream.headers.get("Content-Length", "0")
                return web.Response(status=status, headers=out_headers)
            if fault == "garble":
                half = len(payload) // 2
                payload = payload[:half] + b"\xff" * (len(payload) - half)
            if fault == "trickle" and request.method == "GET":
                return await self._trickle(request, status, out_headers, payload)
            if fault == "stall_body" and len(payload) > 1:
                return await self._stall_body(request, status, out_headers, payload)
            return web.Response(status=status, body=payload, headers=out_headers)

    async def _read_slowly(self, request: web.Request) -> bytes:
        """The request body: its start ``upload_step`` bytes at a time with a pause
        before each, then the rest."""
        chunks = []
        slow = 0
        while slow < self.upload_slow_bytes:
            await asyncio.sleep(self.upload_gap_s)
            chunk = await request.content.read(self.upload_step)
            if not chunk:
                break
            slow += len(chunk)
            chunks.append(chunk)
        chunks.append(await request.read())
        return b"".join(chunks)

    async def _stall_body(
        self, request: web.Request, status: int, headers: dict[str, str], payload: bytes
    ) -> web.StreamResponse:
        """Promise the whole body, send a sliver of it, then go silent until stop()."""
        self.stalled += 1
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: min(16, len(payload) - 1)])
        await self._released.wait()
        return response

    async def _trickle(
        self, request: web.Request, status: int, headers: dict[str, str], payload: bytes
    ) -> web.StreamResponse:
        """The whole body, in 16 slivers with a pause before each: slow but never silent long."""
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(payload)
        await response.prepare(request)
        step = max(1, -(-len(payload) // 16))
        for offset in range(0, len(payload), step):
            await asyncio.sleep(self.trickle_gap_s)
            await response.write(payload[offset : offset + step])
        return response

    def stop(self) -> None:
        async def close() -> None:
            self._released.set()
            await self._runner.cleanup()
            await self._session.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
