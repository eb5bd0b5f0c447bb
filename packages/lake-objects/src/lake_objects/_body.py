"""A multipart part body that aiohttp sends without copying it.

Handing aiohttp a 64 MiB ``bytes`` body makes asyncio's socket transport
(Python 3.11) copy whatever the kernel does not take at once, and a
``BytesIO`` body is copied by aiohttp itself; either doubles the memory of
every part in flight. :class:`PartBody` is a seekable file object over the
part's buffer (botocore reads it to sign and size the request) and
:class:`_PartPayload` writes it to the connection in 1 MiB memoryview
slices, waiting for the transport to drain between them.
"""

from __future__ import annotations

import io
from typing import Any

from aiohttp import payload as aiohttp_payload

__all__ = ["PartBody"]

_SLICE = 1024 * 1024


class PartBody(io.RawIOBase):
    """A read-only, seekable view of one part's bytes."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self._view = memoryview(data)
        self._pos = 0

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
        view = self._value.view
        for offset in range(0, len(view), _SLICE):
            await writer.write(view[offset : offset + _SLICE])

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = self._value.view
        if content_length is not None:
            view = view[:content_length]
        for offset in range(0, len(view), _SLICE):
            await writer.write(view[offset : offset + _SLICE])


aiohttp_payload.register_payload(_PartPayload, PartBody, order=aiohttp_payload.Order.try_first)
