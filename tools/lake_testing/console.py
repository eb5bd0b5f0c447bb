"""``lake console`` for tests and benchmarks: start one by pid, and an HTTP session of it.

:class:`Session` is a signed-in session without a browser (urllib, a cookie
jar, redirects not followed); :class:`ConsoleProcess` a console process,
stopped by its pid.
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
