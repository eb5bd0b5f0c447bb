"""Read capabilities: presigned GETs, and reading through one with verification.

A :class:`ReadCapability` is a bearer value: whoever holds the URL and headers
can read the object until it expires. Its ``repr`` and ``str`` never show
them, and errors raised while using one never include the URL.
:func:`open_capability` streams the object over plain HTTP, follows no
redirect, and checks it exactly like a direct read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import aiohttp

from lake_core.models import DataLocation
from lake_objects.descriptor import ReadCapabilityResult
from lake_objects.errors import (
    CapabilityRejected,
    ObjectNotFound,
    ObjectOverlong,
    ObjectStoreUnavailable,
    PrematureEof,
    RangeMismatch,
)
from lake_objects.reader import CHUNK_SIZE, ObjectReader, check_range

__all__ = ["ReadCapability", "capability_session", "check_content_range", "open_capability"]


class ReadCapability:
    """A time-limited GET for one object: send ``headers`` with a GET of ``url``."""

    __slots__ = ("_headers", "_url", "expires_at")

    def __init__(self, url: str, headers: Mapping[str, str], expires_at: datetime) -> None:
        self._url = url
        self._headers = MappingProxyType(dict(headers))
        self.expires_at = expires_at

    @property
    def url(self) -> str:
        """Sensitive: anyone holding it can read the object until it expires. Do not log."""
        return self._url

    @property
    def headers(self) -> Mapping[str, str]:
        """Headers to send with the GET (a Range header may be added). Sensitive."""
        return self._headers

    def __repr__(self) -> str:
        return (
            f"ReadCapability(url=<redacted>, headers=<{len(self._headers)} redacted>, "
            f"expires_at={self.expires_at.isoformat()})"
        )

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a ReadCapability is a bearer secret and is not picklable")

    @classmethod
    def from_result(cls, result: ReadCapabilityResult) -> ReadCapability:
        expires = datetime.fromtimestamp(result.expires_at_ms / 1000, tz=UTC)
        return cls(result.url, result.headers, expires)

    def to_result(self) -> ReadCapabilityResult:
        return ReadCapabilityResult(
            url=self._url,
            headers=dict(self._headers),
            expires_at_ms=int(self.expires_at.timestamp() * 1000),
        )


def check_content_range(
    location: DataLocation,
    start: int,
    end: int,
    content_range: str | None,
    length: str | int | None,
) -> None:
    """Accept only ``bytes start-(end-1)/size`` with a length of exactly ``end - start``."""
    want = f"bytes {start}-{end - 1}/{location.size_bytes}"
    if content_range != want:
        raise RangeMismatch(
            f"range {start}..{end} of {location.uri!r}: storage answered Content-Range "
            f"{str(content_range)[:100]!r}, expected {want!r}",
            uri=location.uri,
        )
    if length is None or str(length) != str(end - start):
        raise RangeMismatch(
            f"range {start}..{end} of {location.uri!r}: storage answered a length of "
            f"{str(length)[:40]}, expected {end - start}",
            uri=location.uri,
        )


def check_whole_length(location: DataLocation, length: str | int | None) -> None:
    """Fail before the first byte when the declared length already disagrees."""
    if length is None:
        return
    try:
        value = int(length)
    except ValueError:
        return
    if value > location.size_bytes:
        raise ObjectOverlong(
            f"object {location.uri!r} is {value} bytes, longer than its declared "
            f"{location.size_bytes}",
            uri=location.uri,
        )
    if value < location.size_bytes:
        raise PrematureEof(
            f"object {location.uri!r} is {value} bytes, shorter than its declared "
            f"{location.size_bytes}",
            uri=location.uri,
        )


def capability_session(timeout_s: float = 60.0) -> aiohttp.ClientSession:
    """An HTTP session for capability reads: no decompression, bounded connect and read waits."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s),
        auto_decompress=False,
    )


async def open_capability(
    capability: ReadCapability,
    location: DataLocation,
    *,
    start: int | None = None,
    end: int | None = None,
    timeout_s: float = 60.0,
    session: aiohttp.ClientSession | None = None,
) -> ObjectReader:
    """Stream one object (or the exact range) through a capability, verified.

    With ``session`` the read reuses its connections (and leaves it open);
    otherwise it opens a session of its own and closes it with the reader.
    """
    ranged = start is not None or end is not None
    if ranged:
        if start is None or end is None:
            raise TypeError("a range needs both start and end")
        check_range(location, start, end)
    headers = dict(capability.headers)
    if ranged:
        headers["Range"] = f"bytes={start}-{end - 1}"  # type: ignore[operator]
    owned = session is None
    if session is None:
        session = capability_session(timeout_s)
    try:
        response = await session.get(capability.url, headers=headers, allow_redirects=False)
    except (aiohttp.ClientError, TimeoutError) as exc:
        if owned:
            await session.close()
        raise ObjectStoreUnavailable(
            f"reading {location.uri!r} through a capability failed: {type(exc).__name__}"
        ) from None

    async def close() -> None:
        response.release()
        if owned:
            await session.close()

    try:
        _check_response(location, response, start, end)
    except BaseException:
        await close()
        raise
    reader = ObjectReader(
        location,
        _body(response, location),
        start=start or 0,
        end=end if ranged else None,
        close=close,
    )
    return reader


def _check_response(
    location: DataLocation,
    response: aiohttp.ClientResponse,
    start: int | None,
    end: int | None,
) -> None:
    status = response.status
    if 300 <= status < 400:
        raise CapabilityRejected(
            f"storage redirected the read of {location.uri!r} ({status}); redirects are not followed"
        )
    if status in (401, 403):
        raise CapabilityRejected(
            f"storage refused the capability for {location.uri!r} ({status}): expired or invalid"
        )
    if status == 404:
        raise ObjectNotFound(f"object {location.uri!r} does not exist")
    if status == 429 or status >= 500:
        # An outage or throttling, for a range too: not a response that names other bytes.
        raise ObjectStoreUnavailable(f"storage answered {status} for {location.uri!r}; retry")
    length = response.headers.get("Content-Length")
    if start is not None and end is not None:
        if status != 206:
            raise RangeMismatch(
                f"range {start}..{end} of {location.uri!r}: storage answered {status}, not 206",
                uri=location.uri,
            )
        check_content_range(location, start, end, response.headers.get("Content-Range"), length)
        return
    if status != 200:
        raise ObjectStoreUnavailable(f"storage answered {status} for {location.uri!r}")
    check_whole_length(location, length)


async def _body(response: aiohttp.ClientResponse, location: DataLocation) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.content.iter_chunked(CHUNK_SIZE):
            yield chunk
    except aiohttp.ClientPayloadError:
        raise PrematureEof(
            f"the response for {location.uri!r} ended before its declared length",
            uri=location.uri,
        ) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ObjectStoreUnavailable(
            f"reading {location.uri!r} through a capability failed: {type(exc).__name__}"
        ) from None
