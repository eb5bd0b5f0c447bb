"""Episode views and FILE bytes: videos play and seek through HTTP Range requests.

A FILE link carries its DataLocation in the URL (``/file?loc=...``, base64
JSON). The bytes are read with the signed-in principal's own client, whose
stage is the principal's tenant's: a location outside it is refused by the
SDK (``LocationOutsideStage``), as everywhere else. A response holds at
most one chunk of the object at a time: a Range request gets at most
``range_chunk_bytes`` (an open-ended one, ``bytes=N-``, gets that much and
the browser asks again), read with the SDK's exact range reads, or, from a
local stage, mapped from the object's file by its store (``map_range``,
the same checks) and sent from the page cache without a copy; a request
without Range streams the whole object, verified against its SHA-256.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from lake_core.errors import InvalidArgument, LakeError
from lake_core.filetype import is_file_field
from lake_core.models import DataLocation
from lake_objects.reader import ObjectReader
from lake_sdk._client import AsyncClient
from lake_sdk.console.data_pages import QueryState, read_page
from lake_sdk.console.render import cell, e, error_box
from lake_sdk.recordings import MEDIA_TYPE as MCAP_MEDIA_TYPE

__all__ = [
    "ByteRange",
    "MappedRangeResponse",
    "PartialResponse",
    "RangeResponse",
    "byte_headers",
    "decode_location",
    "encode_location",
    "episode_body",
    "parse_range",
]

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
#: CSP of FILE bytes: a document made of a stage object's bytes runs no script and
#: is no page of the console's origin (whatever its media type claims).
_BYTES_CSP = "sandbox; default-src 'none'; img-src 'self'; media-src 'self'"


def _shown_inline(media_type: str) -> bool:
    """Media a browser plays or shows without running anything (SVG can hold script)."""
    kind = media_type.split(";", 1)[0].strip().lower()
    if kind.startswith(("video/", "audio/")):
        return True
    return kind.startswith("image/") and kind != "image/svg+xml"


def byte_headers(media_type: str, download: bool) -> dict[str, str]:
    """Headers of a FILE bytes response.

    The media type comes from the link (any user of the tenant can write a
    FILE value, or a link, claiming ``text/html``): only media that cannot
    script the console's origin is served inline; the rest downloads, and
    every response is sandboxed besides.
    """
    headers = {
        "Accept-Ranges": "bytes",
        "Cache-Control": "private, max-age=300",
        "Content-Security-Policy": _BYTES_CSP,
    }
    if download or not _shown_inline(media_type):
        headers["Content-Disposition"] = "attachment"
    return headers


def encode_location(location: DataLocation | dict[str, Any]) -> str:
    data = location.model_dump() if isinstance(location, DataLocation) else dict(location)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_location(text: str) -> DataLocation:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return DataLocation.model_validate(json.loads(raw))
    except LakeError:
        raise
    except Exception:
        raise InvalidArgument("loc is not a FILE location this console wrote") from None


class ByteRange:
    """Half-open ``start..end`` of an object of ``size`` bytes."""

    def __init__(self, start: int, end: int, size: int) -> None:
        self.start, self.end, self.size = start, end, size

    @property
    def header(self) -> str:
        return f"bytes {self.start}-{self.end - 1}/{self.size}"


def parse_range(header: str, size: int, limit: int) -> ByteRange | None:
    """One ``bytes=`` range, clipped to ``limit`` bytes; None if unsatisfiable.

    ``bytes=a-b``, ``bytes=a-`` and the suffix form ``bytes=-n``. Several
    ranges are not served (the first is taken), as browsers never ask them.
    """
    first = header.split(",", 1)[0].strip()
    match = _RANGE.match(first)
    if match is None or (not match[1] and not match[2]):
        return None
    if match[1]:
        start = int(match[1])
        end = int(match[2]) + 1 if match[2] else size
    else:
        start, end = max(0, size - int(match[2])), size
    end = min(end, size, start + limit)
    if start >= size or start >= end:
        return None
    return ByteRange(start, end, size)


async def stream(reader: ObjectReader) -> AsyncIterator[bytes]:
    """The reader's chunks, each sent once the next is read (the reader closed however it ends).

    The reader checks the object's size and SHA-256 when it reaches the end,
    after its last chunk: holding each chunk back until the next read means
    the last one goes out only once the object checked out, so a corrupt
    object ends the response short of its Content-Length (the client sees a
    broken download) instead of arriving whole and wrong.
    """
    try:
        held: bytes | None = None
        async for chunk in reader:
            if held is not None:
                yield held
            held = chunk
        if held is not None:
            yield held
    finally:
        await reader.aclose()


class PartialResponse(Response):
    """A 206 with the given headers and no body of Starlette's: subclasses send it.

    Starlette's ``Response.__init__`` renders a body; these responses send
    theirs themselves, so they set only what ``init_headers`` and the
    server need.
    """

    def __init__(self, headers: Mapping[str, str], media_type: str) -> None:
        self.status_code = 206
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class RangeResponse(PartialResponse):
    """A 206 with one range's bytes, sent chunk by chunk as the reader yields them.

    Starlette's ``StreamingResponse`` also listens for a disconnect in a task
    of its own, which a whole-object stream needs (it could run for minutes)
    but a range of at most ``range_chunk_bytes`` does not: this sends each
    chunk as it comes, the last one with the end of the body (one message
    for a range read as one chunk), and closes the reader however it ends.
    It holds at most two chunks: the one being sent and the one read ahead.
    """

    def __init__(self, reader: ObjectReader, headers: Mapping[str, str], media_type: str) -> None:
        super().__init__(headers, media_type)
        self.reader = reader

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = aiter(self.reader)
        # The first chunk's read (on a worker thread, for a local stage) overlaps
        # the header's send and access log line.
        first = asyncio.ensure_future(anext(chunks, None))
        try:
            await send({"type": "http.response.start", "status": 206, "headers": self.raw_headers})
            held = await first
            if held is not None:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": held, "more_body": True})
                    held = chunk
            await send({"type": "http.response.body", "body": held or b"", "more_body": False})
        finally:
            if not first.done():
                first.cancel()
                await asyncio.wait([first])  # the read let go of the file before it closes
            if not first.cancelled():
                first.exception()  # retrieved: the response already ended another way
            await self.reader.aclose()


class MappedRangeResponse(PartialResponse):
    """A 206 whose body is a range mapped from a local stage's file (``map_range``).

    One body message holding the view: the server writes it to the socket
    straight from the page cache, with no copy into the console's memory;
    the mapping (at most ``range_chunk_bytes``) ends with the last reference.
    """

    def __init__(self, view: memoryview, headers: Mapping[str, str], media_type: str) -> None:
        super().__init__(headers, media_type)
        self.view: memoryview | None = view

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        view, self.view = self.view, None
        await send({"type": "http.response.start", "status": 206, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": view, "more_body": False})


def _viewer(name: str, location: dict[str, Any]) -> str:
    src = f"/file?loc={encode_location(location)}"
    media = str(location.get("media_type", ""))
    download = (
        f'<a data-testid="file-download" href="{e(src)}&amp;download=1">download '
        f"{e(name)} ({int(location.get('size_bytes', 0)):,} bytes)</a>"
    )
    if media.startswith("video/"):
        player = (
            f'<video data-testid="video-player" controls preload="metadata" muted '
            f'src="{e(src)}" type="{e(media)}"></video>'
        )
        return f'<section class="file"><h2>{e(name)}</h2>{player}<p>{download}</p></section>'
    if media.startswith("image/"):
        return (
            f'<section class="file"><h2>{e(name)}</h2><img alt="{e(name)}" src="{e(src)}">'
            f"<p>{download}</p></section>"
        )
    return f'<section class="file"><h2>{e(name)}</h2><p>{e(media)}: {download}</p></section>'


async def _recording(client: AsyncClient, name: str, value: dict[str, Any]) -> str:
    """An MCAP recording: its topics and time range, from its summary (a few KiB read)."""
    from lake_sdk.errors import MissingExtra
    from lake_sdk.mcap import recording_summary_async

    try:
        summary, fetched = await recording_summary_async(client, DataLocation(**value))
    except (LakeError, MissingExtra) as exc:
        return f'<section class="file"><h2>{e(name)}</h2>{error_box(exc)}</section>'
    start = summary.start_time.isoformat() if summary.start_time else "none"
    end = summary.end_time.isoformat() if summary.end_time else "none"
    topics = "".join(
        f'<tr data-testid="topic-item"><td>{e(t.topic)}</td><td>{e(t.schema_name)}</td>'
        f'<td>{e(t.message_encoding)}</td><td class="num">{t.message_count:,}</td></tr>'
        for t in summary.topics
    )
    return (
        f'<section class="file" data-testid="recording"><h2>{e(name)}</h2>'
        f"<p>{summary.message_count:,} messages from {e(start)} to {e(end)} "
        f"({summary.duration_s:.3f} s); {fetched:,} bytes read for this summary.</p>"
        '<table class="grid"><thead><tr><th>topic</th><th>schema</th><th>encoding</th>'
        f"<th>messages</th></tr></thead><tbody>{topics}</tbody></table>"
        f"{_viewer(name, value)}</section>"
    )


async def episode_body(client: AsyncClient, state: QueryState, row: int, page_rows: int) -> str:
    """Row ``row`` of the statement's result: its FILE values shown, its other values listed."""
    back = f'<p><a href="{e(state.url(page=row // page_rows))}">back to the result</a></p>'
    try:
        table, _ = await read_page(client, QueryState(state.sql, state.as_of, row), 1)
    except LakeError as exc:
        return back + error_box(exc)
    if table.num_rows == 0:
        return back + error_box(InvalidArgument(f"the result has no row {row}"))
    values = table.to_pylist()[0]
    files, facts = [], []
    for field in table.schema:
        value = values[field.name]
        if is_file_field(field) and value is not None:
            if value.get("media_type") == MCAP_MEDIA_TYPE:
                files.append(await _recording(client, field.name, value))
            else:
                files.append(_viewer(field.name, value))
        elif not is_file_field(field):
            facts.append(f"<tr><th>{e(field.name)}</th>{cell(field, value)}</tr>")
    return f'{back}<table class="facts">{"".join(facts)}</table>{"".join(files)}'
