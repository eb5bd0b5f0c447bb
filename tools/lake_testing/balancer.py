"""A TCP front for several Query replicas, as a load balancer is: one address, any replica.

Each accepted connection is piped to the current backend. :meth:`Balancer.route`
sends new connections to another backend and cuts the live ones, the way a
balancer moves a client when it rebalances or a replica drains: the
client's gRPC channel reconnects through the same address and lands on the
other replica. Loopback only; threads, no event loop.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["Balancer"]


class Balancer:
    def __init__(self, backend: str) -> None:
        self._backend = backend
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        #: Connections piped to each backend so far.
        self.connections: dict[str, int] = {}
        self._thread = threading.Thread(target=self._accept, name="balancer", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def route(self, backend: str) -> None:
        """New connections go to ``backend`` (``host:port``); live ones are cut."""
        with self._lock:
            self._backend = backend
            live, self._live = self._live, set()
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.route(self._backend)
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                backend = self._backend
                self.connections[backend] = self.connections.get(backend, 0) + 1
            host, port = backend.rsplit(":", 1)
            try:
                upstream = socket.create_connection((host, int(port)), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._live.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
