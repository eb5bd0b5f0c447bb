"""A stand-in Iceberg REST catalog whose table loads a test answers itself.

It serves what pyiceberg asks before a load (``/v1/config``, namespace HEADs)
and hands every other GET to the test's ``answer(handler)``: a table document,
a 404, or something hostile (a drip, an endless body). Start it with
:func:`serving`; :attr:`FakeCatalog.endpoint` is its base URL.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Answer", "FakeCatalog", "documents", "send_json", "serving"]

#: How a test answers one GET (anything but ``/v1/config``).
Answer = Callable[[BaseHTTPRequestHandler], None]


class FakeCatalog(ThreadingHTTPServer):
    """The server; set :attr:`answer` to change how later GETs are answered."""

    daemon_threads = True

    def __init__(self, answer: Answer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answer = answer

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeCatalog

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:  # namespace checks
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        if self.path.startswith("/v1/config"):
            send_json(self, 200, b"{}")
        else:
            with contextlib.suppress(OSError):  # a client that gave up, as it should
                self.server.answer(self)


def send_json(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    """One whole JSON response."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def documents(tables: Mapping[str, bytes]) -> Answer:
    """Answer a load of table ``name`` (the path's last part) with ``tables[name]``, else 404.

    ``tables`` is read at each request, so a test may add documents later.
    """

    def answer(handler: BaseHTTPRequestHandler) -> None:
        name = handler.path.rsplit("/", 1)[-1]
        if name in tables:
            send_json(handler, 200, tables[name])
        else:
            error = {"message": "no such table", "type": "NoSuchTableException", "code": 404}
            send_json(handler, 404, json.dumps({"error": error}).encode())

    return answer


@contextlib.contextmanager
def serving(answer: Answer) -> Iterator[FakeCatalog]:
    """A :class:`FakeCatalog` serving on a thread until the block ends."""
    server = FakeCatalog(answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
