"""A multipart part body that aiohttp sends without copying it.

Handing aiohttp a 64 MiB ``bytes`` body makes asyncio's socket transport
(Python 3.11) copy whatever the kernel does not take at once, and a
``BytesIO`` body is copied by aiohttp itself; either doubles the memory of
every part in flight. :class:`PartBody` is a seekable file object over the
part's buffer (botocore reads it to sign and size the request) and
:class:`_PartPayload` writes it to the connection in 1 MiB memoryview
slices, waiting for the transport to drain between them.

A body with a ``stall_timeout_s`` fails its attempt with a timeout when the
peer takes none of its bytes for that long: aiohttp starts its read timeout
only once the whole body was sent, so a store that stops reading a body
mid-part (its TCP window shut) would otherwise hang the upload forever.
Progress is what the peer acknowledged (Linux; elsewhere, what the kernel
took from the transport's buffer, which moves in coarser steps).
"""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Coroutine
from typing import Any

from aiohttp import ServerTimeoutError
from aiohttp import payload as aiohttp_payload

__all__ = ["PartBody"]

_SLICE = 1024 * 1024
#: How often a sent body's acknowledgement is looked for: soon, then at most this often.
_FIRST_POLL_S = 0.001
_LAST_POLL_S = 0.05

if sys.platform == "linux":
    import fcntl
    import termios

    #: The ioctl for a TCP socket's unacknowledged bytes (SIOCOUTQ).
    _OUTQ: int | None = termios.TIOCOUTQ
else:
    _OUTQ = None


class PartBody(io.RawIOBase):
    """A read-only, seekable view of one part's bytes.

    ``stall_timeout_s``: how long sending it may go without the peer taking
    a byte before the attempt fails (None: no bound).
    """

    def __init__(self, data: bytes, stall_timeout_s: float | None = None) -> None:
        super().__init__()
        self._view = memoryview(data)
        self._pos = 0
        self.stall_timeout_s = stall_timeout_s

    def release(self) -> None:
        """Drop the part's buffer now: aiohttp and botocore objects that still
        reference this body (some only until the cyclic GC runs) keep nothing big."""
        self._view = memoryview(b"")
        self._pos = 0

    def __len__(self) -> int:
        return len(self._view)

    @property
    def view(self) -> memoryview:
        return self._view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        stop = (
            len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        )
        data = bytes(self._view[self._pos : stop])
        self._pos = stop
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        # aiohttp and botocore close bodies they are done with; the buffer stays valid.
        pass


class _PartPayload(aiohttp_payload.Payload):
    _value: PartBody

    def __init__(self, value: PartBody, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("content_type", "application/octet-stream")
        super().__init__(value, *args, **kwargs)
        self._size = len(value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        raise TypeError("a part body is binary")

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = self._value.view
        if content_length is not None:
            view = view[:content_length]
        stall_s = self._value.stall_timeout_s
        if stall_s is None:
            await _send(writer, view)
        else:
            await _unless_stalled(_send_acknowledged(writer, view), writer, stall_s)


async def _send(writer: Any, view: memoryview) -> None:
    for offset in range(0, len(view), _SLICE):
        await writer.write(view[offset : offset + _SLICE])


async def _send_acknowledged(writer: Any, view: memoryview) -> None:
    """Send ``view``, then wait until the peer acknowledged all of it.

    aiohttp's read timer starts when the body writer returns; without the
    wait, a slow link still draining megabytes of the kernel's send buffer
    would count as a silent store.
    """
    await _send(writer, view)
    pause = _FIRST_POLL_S
    while _unacknowledged(writer):
        await asyncio.sleep(pause)
        pause = min(2 * pause, _LAST_POLL_S)


def _unacknowledged(writer: Any) -> int:
    """Bytes in the kernel's send queue the peer has not acknowledged (0 where unknown)."""
    transport = writer.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or _OUTQ is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), _OUTQ, bytes(4))
    except OSError:
        return 0
    return max(0, int.from_bytes(raw, sys.byteorder, signed=True))


def _delivered(writer: Any) -> int:
    """Bytes of this connection's output the peer took (monotonic while sending).

    The kernel's send queue counts as not delivered: it reports room only once
    a third of it drained, so a slow link would look silent for seconds.
    """
    transport = writer.transport
    buffered = transport.get_write_buffer_size() if transport is not None else 0
    return int(writer.output_size) - buffered - _unacknowledged(writer)


async def _unless_stalled(sending: Coroutine[Any, Any, None], writer: Any, stall_s: float) -> None:
    """Await ``sending``; fail when the peer takes no byte of it for ``stall_s``.

    Progress is checked four times per ``stall_s``: a slow link that keeps
    moving is never cut, a shut window fails within 1.25 x ``stall_s``. The
    error is a ServerTimeoutError, which aiohttp hands to the waiting request
    and botocore retries as a read timeout, like any other stall.
    """
    task = asyncio.ensure_future(sending)
    loop = asyncio.get_running_loop()
    delivered, since = _delivered(writer), loop.time()
    try:
        while not (await asyncio.wait({task}, timeout=stall_s / 4))[0]:
            now = _delivered(writer)
            if now != delivered:
                delivered, since = now, loop.time()
            elif loop.time() - since >= stall_s:
                raise ServerTimeoutError(f"request body not taken for {stall_s:g} s")
        task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})


aiohttp_payload.register_payload(_PartPayload, PartBody, order=aiohttp_payload.Order.try_first)
