"""FILE access for a client: stage discovery, the object store, direct and Query-issued reads.

A client discovers its stage once (one ``lake.managed_stage`` action, the
first time it needs storage) and opens the store with its own process's
credentials. Clones share the discovery and the store. A query-only client
never discovers a stage nor builds a storage client: it reads through
capabilities Query issues (``lake.read_capability``), one action per reader.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from lake_core import protocol
from lake_core.errors import InvalidArgument
from lake_core.models import DataLocation
from lake_objects.capability import ReadCapability, capability_session, open_capability
from lake_objects.descriptor import (
    MANAGED_STAGE,
    READ_CAPABILITY,
    ReadCapabilityRequest,
    ReadCapabilityResult,
    StageDescriptor,
    StageRequest,
)
from lake_objects.errors import CapabilityRejected, InvalidUpload, StageUnavailable
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader, check_range
from lake_objects.s3 import DEFAULT_UPLOAD_CONCURRENCY, MAX_UPLOAD_CONCURRENCY
from lake_objects.store import ManagedObjectStore, capability_ttl, open_store

__all__ = [
    "DEFAULT_FILE_TTL_S",
    "DEFAULT_STORAGE_TIMEOUT_S",
    "CapabilityRanges",
    "FileAccess",
    "FileOptions",
    "StoreRanges",
]

#: Lifetime of each capability an ``open_file`` on a query-only client asks for.
DEFAULT_FILE_TTL_S = 300
#: How long object storage may stay silent before a FILE read or upload fails
#: (ObjectStoreUnavailable, retryable); a direct S3 request is tried three times,
#: so a stalled S3 surfaces within about three times this (lake_objects.s3.s3_client).
DEFAULT_STORAGE_TIMEOUT_S = 30.0
#: Renew a capability when less than this much of its life is left (at most a quarter of it).
RENEW_MARGIN_S = 30.0

Action = Callable[[str, bytes], Awaitable[bytes]]


@dataclass(frozen=True)
class FileOptions:
    """How a client handles FILE values."""

    upload_checkpoint_dir: Path | None = None
    upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY
    query_only: bool = False
    store: ManagedObjectStore | None = None
    progress: ProgressCallback | bool | None = None
    storage_timeout: float = DEFAULT_STORAGE_TIMEOUT_S

    @classmethod
    def create(
        cls,
        *,
        upload_checkpoint_dir: str | os.PathLike[str] | None = None,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
        query_only: bool = False,
        store: ManagedObjectStore | None = None,
        progress: ProgressCallback | bool | None = None,
        storage_timeout: float = DEFAULT_STORAGE_TIMEOUT_S,
    ) -> FileOptions:
        """Validated options: bad ones fail before connecting (and long before any storage call)."""
        if isinstance(storage_timeout, bool) or not isinstance(storage_timeout, int | float):
            raise InvalidArgument("storage_timeout must be a number of seconds")
        if not 0 < storage_timeout <= 3600:
            raise InvalidArgument(f"storage_timeout must be in (0, 3600] s, got {storage_timeout}")
        if (
            isinstance(upload_concurrency, bool)
            or not isinstance(upload_concurrency, int)
            or not 1 <= upload_concurrency <= MAX_UPLOAD_CONCURRENCY
        ):
            raise InvalidUpload(
                f"upload_concurrency must be in 1..={MAX_UPLOAD_CONCURRENCY}, "
                f"got {upload_concurrency!r}"
            )
        if not (progress is None or isinstance(progress, bool) or callable(progress)):
            raise InvalidUpload("progress must be None, True, False or a callable")
        if query_only and store is not None:
            raise InvalidUpload("a query-only client cannot have an object store")
        directory = (
            None
            if upload_checkpoint_dir is None
            else Path(upload_checkpoint_dir).expanduser().absolute()
        )
        return cls(
            directory, upload_concurrency, query_only, store, progress, float(storage_timeout)
        )


class FileAccess:
    """One client's (and its clones') stage and object store."""

    def __init__(self, options: FileOptions, action: Action) -> None:
        self.options = options
        self._action = action
        self._store = options.store
        self._lock = asyncio.Lock()
        self.discoveries = 0

    async def descriptor(self) -> StageDescriptor:
        return (await self.store()).descriptor

    async def store(self) -> ManagedObjectStore:
        """The managed store, discovered through Query on first use."""
        if self._store is not None:
            return self._store
        if self.options.query_only:
            raise StageUnavailable(
                "a query-only client has no storage access: use open_via_query, "
                "open_range_via_query or presign_read_via_query"
            )
        async with self._lock:
            if self._store is None:
                self.discoveries += 1
                body = await self._action(MANAGED_STAGE, protocol.encode(StageRequest()))
                descriptor = protocol.decode(StageDescriptor, body)
                options: dict[str, object] = {}
                if descriptor.kind == "s3":
                    options["upload_concurrency"] = self.options.upload_concurrency
                    options["stall_timeout_s"] = self.options.storage_timeout
                self._store = open_store(descriptor, **options)
        return self._store

    async def open(self, location: DataLocation) -> ObjectReader:
        return await (await self.store()).open(location)

    async def open_range(self, location: DataLocation, start: int, end: int) -> ObjectReader:
        return await (await self.store()).open_range(location, start, end)

    async def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        return await (await self.store()).presign_read(location, ttl)

    # -- through Query -----------------------------------------------------------

    async def presign_read_via_query(
        self,
        location: DataLocation,
        ttl: float | timedelta,
        *,
        start: int | None = None,
        end: int | None = None,
    ) -> ReadCapability:
        if not isinstance(location, DataLocation):
            raise TypeError("expected a DataLocation")
        if start is not None or end is not None:
            check_range(location, start or 0, end or 0)
        request = ReadCapabilityRequest(
            location=location, ttl_secs=capability_ttl(ttl), start=start, end=end
        )
        body = await self._action(READ_CAPABILITY, protocol.encode(request))
        return ReadCapability.from_result(protocol.decode(ReadCapabilityResult, body))

    async def open_via_query(self, location: DataLocation, ttl: float | timedelta) -> ObjectReader:
        capability = await self.presign_read_via_query(location, ttl)
        return await open_capability(capability, location, timeout_s=self.options.storage_timeout)

    async def open_range_via_query(
        self, location: DataLocation, start: int, end: int, ttl: float | timedelta
    ) -> ObjectReader:
        check_range(location, start, end)
        capability = await self.presign_read_via_query(location, ttl, start=start, end=end)
        return await open_capability(
            capability, location, start=start, end=end, timeout_s=self.options.storage_timeout
        )

    async def range_fetcher(
        self, location: DataLocation, ttl: float | timedelta
    ) -> StoreRanges | CapabilityRanges:
        """Exact-range reads of one object for ``open_file``: direct, or through Query."""
        if not isinstance(location, DataLocation):
            raise TypeError("expected a DataLocation")
        if self.options.query_only:
            ranges = CapabilityRanges(self, location, capability_ttl(ttl))
            await ranges.capability()  # fail at open, not at the first read
            return ranges
        capability_ttl(ttl)  # the same argument is checked the same way on every client
        store = await self.store()
        store.check(location)
        return StoreRanges(store, location)

    async def close(self) -> None:
        if self._store is not None and self.options.store is None:
            store, self._store = self._store, None
            await store.close()


class StoreRanges:
    """Ranges of one object read directly from the stage (one Range GET or file read each)."""

    def __init__(self, store: ManagedObjectStore, location: DataLocation) -> None:
        self._store = store
        self._location = location

    async def fetch(self, start: int, end: int) -> bytes:
        reader = await self._store.open_range(self._location, start, end)
        try:
            return await reader.read()
        finally:
            await reader.aclose()

    async def close(self) -> None:
        """The store belongs to the client."""


class CapabilityRanges:
    """Ranges of one object through Query-issued capabilities, renewed before they expire.

    One capability covers the whole object; each fetch adds its exact Range
    header. A capability with less than :data:`RENEW_MARGIN_S` (or a quarter
    of its lifetime) left is replaced before use, and a fetch that storage
    refuses as expired (clocks disagree) is retried once with a new one.
    """

    def __init__(self, files: FileAccess, location: DataLocation, ttl_secs: int) -> None:
        self._files = files
        self._location = location
        self._ttl = ttl_secs
        self._capability: ReadCapability | None = None
        self._session: aiohttp.ClientSession | None = None
        self.issued = 0

    async def capability(self) -> ReadCapability:
        margin = min(RENEW_MARGIN_S, self._ttl / 4)
        current = self._capability
        if current is None or (current.expires_at - datetime.now(UTC)).total_seconds() < margin:
            current = await self._files.presign_read_via_query(self._location, self._ttl)
            self._capability = current
            self.issued += 1
        return current

    async def fetch(self, start: int, end: int) -> bytes:
        if self._session is None:
            self._session = capability_session(self._files.options.storage_timeout)
        for attempt in range(2):
            capability = await self.capability()
            try:
                reader = await open_capability(
                    capability, self._location, start=start, end=end, session=self._session
                )
            except CapabilityRejected:
                if attempt:
                    raise
                self._capability = None
                continue
            try:
                return await reader.read()
            finally:
                await reader.aclose()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
