"""MCAP recordings stored as FILE values: summaries and time-range reads without downloading.

Needs the ``mcap`` extra (``mcap`` and
``mcap-ros2-support``); importing this module works without it, and the
first call names the install. Only the bytes a window needs are fetched: the
summary (a few kilobytes, exact ranges), then the chunks that overlap the
window::

    import lake_sdk
    from lake_sdk.mcap import messages

    with lake_sdk.Client("grpc://127.0.0.1:50051") as client:
        table = client.query_table("SELECT recording FROM robots.recordings LIMIT 1")
        location = lake_sdk.data_location(table, "recording", 0)
        with messages(client, location, topics=["/joint_states"],
                      start=start_ns, end=start_ns + 1_000_000_000) as window:
            for message in window:
                print(message.topic, message.log_time_ns, message.decoded)
        print(window.bytes_fetched, "of", location.size_bytes, "bytes fetched")

``start`` is inclusive and ``end`` exclusive, as MCAP's reader takes them, in
log-time nanoseconds or as aware datetimes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from lake_core.errors import InvalidArgument
from lake_core.models import DataLocation
from lake_sdk._client import AsyncClient
from lake_sdk._sync import Client
from lake_sdk.mcap.extract import Extracted
from lake_sdk.mcap.extract import extract_topic as _extract
from lake_sdk.mcap.read import (
    BLOCK_SIZE,
    AsyncMessages,
    Message,
    Messages,
    check_location,
    time_ns,
    topic_list,
)
from lake_sdk.mcap.summary import RecordingSummary, TopicSummary

__all__ = [
    "AsyncMessages",
    "Extracted",
    "Message",
    "Messages",
    "RecordingSummary",
    "TopicSummary",
    "extract_topic",
    "extract_topic_async",
    "messages",
    "messages_async",
    "recording_summary",
    "recording_summary_async",
]


def _window(
    start: int | datetime | None, end: int | datetime | None
) -> tuple[int | None, int | None]:
    low = time_ns(start, "start")
    high = time_ns(end, "end")
    if low is not None and high is not None and high < low:
        raise InvalidArgument(f"end ({high}) is before start ({low})")
    return low, high


def _file_options(options: dict[str, Any]) -> dict[str, Any]:
    # Chunks are read whole: small blocks, no read-ahead past them, unless the caller says.
    return {"block_size": BLOCK_SIZE, "read_ahead": 0, **options}


def messages(
    client: Client,
    location: DataLocation,
    *,
    topics: Iterable[str] | str | None = None,
    start: int | datetime | None = None,
    end: int | datetime | None = None,
    **options: Any,
) -> Messages:
    """The messages of ``topics`` (all if None) logged in ``[start, end)``, in log-time order.

    ``options`` go to :meth:`~lake_sdk.Client.open_file` (``block_size`` 64 KiB,
    ``cache_bytes``, ``read_ahead`` 0, ``ttl``). Iterate the result once, or
    use it as a context manager; ``bytes_fetched`` says what it cost.
    """
    where = check_location(location)
    names = topic_list(topics)
    low, high = _window(start, end)
    file = client.open_file(where, **_file_options(options))
    return Messages(file, names, low, high)


async def messages_async(
    client: AsyncClient,
    location: DataLocation,
    *,
    topics: Iterable[str] | str | None = None,
    start: int | datetime | None = None,
    end: int | datetime | None = None,
    **options: Any,
) -> AsyncMessages:
    """:func:`messages` for an :class:`~lake_sdk.AsyncClient`: ``async for`` over the result."""
    where = check_location(location)
    names = topic_list(topics)
    low, high = _window(start, end)
    file = await client.open_file(where, **_file_options(options))
    return AsyncMessages(Messages(file, names, low, high))


def recording_summary(
    client: Client, location: DataLocation, **options: Any
) -> tuple[RecordingSummary, int]:
    """The recording's summary and the bytes fetched to read it (its footer and summary)."""
    with messages(client, location, **options) as reader:
        return reader.summary(), reader.bytes_fetched


async def recording_summary_async(
    client: AsyncClient, location: DataLocation, **options: Any
) -> tuple[RecordingSummary, int]:
    """:func:`recording_summary` for an :class:`~lake_sdk.AsyncClient`."""
    reader = await messages_async(client, location, **options)
    async with reader:
        return await reader.summary(), reader.bytes_fetched


async def extract_topic_async(
    client: AsyncClient,
    recordings: str,
    topic: str,
    into: str,
    *,
    where: str | None = None,
    meta_addr: str = "127.0.0.1:50052",
    meta_token: Any = None,
) -> Extracted:
    """Decode ``topic`` of the selected recordings into table ``into`` (created if missing).

    One table version per recording; recordings already in ``into`` are
    skipped. See :mod:`lake_sdk.mcap.extract`.
    """
    from lake_core.metaclient import MetaClient

    addr = meta_addr if "://" in meta_addr else f"http://{meta_addr}"
    async with MetaClient(addr, token=meta_token) as meta:
        return await _extract(client, recordings, topic, into, meta=meta, where=where)


def extract_topic(
    client: Client,
    recordings: str,
    topic: str,
    into: str,
    *,
    where: str | None = None,
    meta_addr: str = "127.0.0.1:50052",
    meta_token: Any = None,
) -> Extracted:
    """:func:`extract_topic_async` on a blocking :class:`~lake_sdk.Client`."""
    return client._runner.run(
        extract_topic_async(
            client._inner,
            recordings,
            topic,
            into,
            where=where,
            meta_addr=meta_addr,
            meta_token=meta_token,
        )
    )
