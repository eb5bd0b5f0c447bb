"""A TCP round-robin balancer: the Kubernetes Service in front of the Metasrv set.

Query replicas dial one address; each new connection goes to the next
backend that accepts it. When a backend dies its connections close, and the
gRPC channel's reconnect lands on a live one, as behind a ClusterIP Service.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

from tools.lake_testing.servers import free_port

__all__ = ["Balancer"]


class Balancer:
    def __init__(self, backends: list[str]) -> None:
        self.backends = list(backends)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._turn = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Balancer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        start = next(self._turn)
        for i in range(len(self.backends)):
            host, port = self.backends[(start + i) % len(self.backends)].rsplit(":", 1)
            try:
                return await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
            except (OSError, TimeoutError):
                continue
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            upstream = await self._connect()
            if upstream is None:
                return
            up_reader, up_writer = upstream
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
        finally:
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
