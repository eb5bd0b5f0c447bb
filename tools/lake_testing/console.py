"""``lake console`` for tests and benchmarks: start one by pid, and an HTTP session of it.

:class:`Session` is a signed-in session without a browser (urllib, a cookie
jar, redirects not followed); :class:`RangeReader` its Range requests read
into one preallocated buffer, as a browser's native stack reads media;
:class:`ConsoleProcess` a console process, stopped by its pid.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import re
import select
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

from tools.lake_testing.servers import free_port


@dataclass
class Reply:
    status: int
    headers: Message
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


@dataclass
class Session:
    """HTTP/1.1 to the console on one persistent connection (as a browser's), with cookies.

    A connection the console closed while idle (its keep-alive timeout) is
    replaced before the next request; a body is read whole by ``http.client``
    (one read of Content-Length bytes). A send or receive stalled ``timeout``
    seconds fails (OSError) rather than hang.
    """

    base: str
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)
    timeout: float = 120.0

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.base)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"expected http://host:port, got {self.base!r}")
        self._host, self._port = parts.hostname, parts.port or 80
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        conn = self._conn
        # Readable while idle means the console closed it (EOF): do not reuse it.
        if conn is not None and conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            self.close()
            conn = None
        if conn is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            conn.connect()
            # A blocking socket whose kernel timeouts bound each send and receive:
            # Python's own timeout would poll() before every recv() of a body.
            assert conn.sock is not None
            conn.sock.settimeout(None)
            limit = struct.pack("ll", int(self.timeout), 0)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
            self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self, path: str, data: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(self.base + path, data=body, headers=headers or {})
        if body is not None:
            request.add_unredirected_header("Content-Type", "application/x-www-form-urlencoded")
        self.jar.add_cookie_header(request)
        method = request.get_method()
        while True:
            reused = self._conn is not None
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=dict(request.header_items()))
                reply = conn.getresponse()
                content = reply.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                # The console closed an idle connection as this request went out:
                # a GET is sent again once, on a new connection.
                if not (reused and method == "GET"):
                    raise
            except BaseException:
                self.close()
                raise
        self.jar.extract_cookies(reply, request)
        if reply.will_close:
            self.close()
        return Reply(reply.status, reply.headers, content)

    def csrf(self, path: str) -> str:
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', self.request(path).text)
        assert match is not None, f"no CSRF field on {path}"
        return match[1]

    def sign_in(self, token: str) -> Reply:
        reply = self.request("/signin", {"csrf": self.csrf("/signin"), "token": token})
        assert reply.status == 303, reply.text[:500]
        return reply


class RangeReader:
    """Range requests of one signed-in session, read the way a browser's native network stack does.

    A kept-alive connection of its own, the session's cookies as they were
    when it was made, and each response (status line, headers and body)
    received with ``recv_into`` straight into one buffer allocated once:
    no per-request header parsing by ``email``, cookie-jar walk or body
    copy in Python, which would cost a Python client more than the transfer
    it measures. :meth:`get` checks the status, ``Content-Range`` and
    ``Content-Length`` and returns a view of the body in that buffer (valid
    until the next request).
    """

    _HEAD_LIMIT = 64 * 1024

    def __init__(self, session: Session, largest_body: int) -> None:
        probe = urllib.request.Request(session.base + "/")
        session.jar.add_cookie_header(probe)
        self._cookie = probe.get_header("Cookie") or ""
        self._address = (session._host, session._port)
        self._timeout = session.timeout
        self._buffer = bytearray(self._HEAD_LIMIT + largest_body)
        self._sock: socket.socket | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=self._timeout)
        sock.settimeout(None)  # kernel timeouts instead: Python's would poll() before every recv
        limit = struct.pack("ll", int(self._timeout), 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def get(self, path: str, start: int, end: int | None = None) -> memoryview:
        """``Range: bytes=start-[end]`` of ``path``: the 206 response's body."""
        last = "" if end is None else str(end - 1)
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {self._address[0]}:{self._address[1]}\r\n"
            f"Cookie: {self._cookie}\r\nRange: bytes={start}-{last}\r\n\r\n"
        ).encode("latin-1")
        for attempt in (0, 1):
            reused = self._sock is not None
            if self._sock is None:
                self._sock = self._connect()
            try:
                return self._exchange(self._sock, request)
            except (ConnectionResetError, BrokenPipeError, EOFError):
                self.close()
                # The console closed an idle connection as this request went out.
                if not reused or attempt:
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _exchange(self, sock: socket.socket, request: bytes) -> memoryview:
        sock.sendall(request)
        view = memoryview(self._buffer)
        got, head_end = 0, -1
        while head_end < 0:
            if got >= self._HEAD_LIMIT:
                raise ValueError("the response headers exceed 64 KiB")
            n = sock.recv_into(view[got : self._HEAD_LIMIT])
            if n == 0:
                raise EOFError("the console closed the connection")
            got += n
            head_end = self._buffer.find(b"\r\n\r\n", 0, got)
        status_line, *lines = bytes(view[:head_end]).decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status_line.split(" ", 2)[1] != "206":
            raise AssertionError(f"expected 206, got {status_line!r}")
        length = int(headers["content-length"])
        body_start = head_end + 4
        total = body_start + length
        if total > len(self._buffer):
            raise ValueError(f"a {length}-byte body does not fit the reader's buffer")
        while got < total:
            n = sock.recv_into(view[got:total])
            if n == 0:
                raise EOFError("the console closed the connection mid-body")
            got += n
        if got != total:
            raise AssertionError("the console sent more than its Content-Length")
        if headers.get("connection", "").lower() == "close":
            self.close()
        if "content-range" not in headers:
            raise AssertionError("a 206 without Content-Range")
        return view[body_start:total]


@dataclass
class ConsoleProcess:
    """A ``lake console`` process for the Query at ``query_url``, logging to ``log_path``."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def start_console(
    query_url: str, log_dir: Path, timeout_s: float = 90.0, *, replicas: Sequence[str] = ()
) -> ConsoleProcess:
    """Start ``lake console`` on a free loopback port and wait until it answers."""
    port = free_port()
    log_path = log_dir / f"console-{port}.log"
    main = "from lake_core.cli import main; main()"
    args = ["console", "--addr", f"127.0.0.1:{port}", "--query", query_url]
    for replica in replicas:
        args += ["--replica", replica]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", main, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    console = ConsoleProcess(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"lake console exited:\n{console.log()[-3000:]}")
        try:
            if Session(console.url).request("/signin").status == 200:
                return console
        except (urllib.error.URLError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            console.stop()
            raise TimeoutError(f"lake console did not answer in {timeout_s}s:\n{console.log()}")
        time.sleep(0.1)
