"""The object-store seam: one ABC, a local and an S3 implementation side by side.

:func:`open_store` picks the implementation for a stage descriptor (a small
registry keyed by the descriptor's kind, as pyiceberg's ``load_file_io``).
Every method that takes a DataLocation checks it against the tenant scope
before any storage call.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from lake_core.errors import InvalidArgument
from lake_core.models import DataLocation
from lake_objects.capability import ReadCapability
from lake_objects.descriptor import (
    MAX_CAPABILITY_TTL_SECS,
    MIN_CAPABILITY_TTL_SECS,
    StageDescriptor,
)
from lake_objects.errors import PresignUnsupported
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader, check_range
from lake_objects.scope import TenantScope
from lake_objects.source import FileUpload

__all__ = [
    "STORE_IMPLEMENTATIONS",
    "ManagedObjectStore",
    "capability_ttl",
    "open_store",
    "register_store",
]


def capability_ttl(ttl: float | timedelta) -> int:
    """A capability lifetime in whole seconds, 1 s..=1 h."""
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument("a capability ttl is a number of seconds or a timedelta")
    whole = int(seconds)
    if whole != seconds or not MIN_CAPABILITY_TTL_SECS <= whole <= MAX_CAPABILITY_TTL_SECS:
        raise InvalidArgument(
            f"a capability ttl must be whole seconds in {MIN_CAPABILITY_TTL_SECS}.."
            f"={MAX_CAPABILITY_TTL_SECS}, got {seconds!r}"
        )
    return whole


class ManagedObjectStore(ABC):
    """One tenant's managed stage: upload objects, read them back verified."""

    def __init__(self, descriptor: StageDescriptor) -> None:
        self.descriptor = descriptor
        self.scope: TenantScope = descriptor.scope

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.descriptor.uri!r})"

    def check(self, location: DataLocation) -> str:
        """The object's name inside the stage; LocationOutsideStage before any I/O."""
        if not isinstance(location, DataLocation):
            raise InvalidArgument("expected a DataLocation")
        return self.scope.check(location.uri)

    @abstractmethod
    async def upload(
        self,
        upload: FileUpload,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> DataLocation:
        """Store the upload's bytes as a new object and return its DataLocation."""

    @abstractmethod
    async def _open(self, location: DataLocation, name: str) -> ObjectReader: ...

    @abstractmethod
    async def _open_range(
        self, location: DataLocation, name: str, start: int, end: int
    ) -> ObjectReader: ...

    async def open(self, location: DataLocation) -> ObjectReader:
        """A reader that proves size and SHA-256 when drained to EOF."""
        name = self.check(location)
        return await self._open(location, name)

    async def open_range(self, location: DataLocation, start: int, end: int) -> ObjectReader:
        """Exactly bytes ``start..end`` (half-open); bad ranges fail before any I/O."""
        name = self.check(location)
        check_range(location, start, end)
        return await self._open_range(location, name, start, end)

    async def map_range(self, location: DataLocation, start: int, end: int) -> memoryview | None:
        """Bytes ``start..end`` of the stage's own file, mapped read-only (no copy), or None.

        None where the stage has no local files (S3): read with :meth:`open_range`.
        Checked as :meth:`open_range` is (tenant, range, the object's size);
        the mapping ends when the last reference to the view is dropped.
        """
        self.check(location)
        check_range(location, start, end)
        return None

    async def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        """A bearer GET capability for one object (S3 stages only)."""
        self.check(location)
        capability_ttl(ttl)
        raise PresignUnsupported(f"a {self.descriptor.kind} stage cannot presign reads")

    async def cancel_upload(
        self, path: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str]
    ) -> bool:
        """Abort the checkpointed upload of ``path``; True if there was one."""
        return False

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release connections."""


#: Stage kind -> "module:attribute" of its store factory, imported on first use.
STORE_IMPLEMENTATIONS: dict[str, str] = {
    "local": "lake_objects.local:LocalObjectStore",
    "s3": "lake_objects.s3:S3ObjectStore",
}
_FACTORIES: dict[str, Callable[..., ManagedObjectStore]] = {}


def register_store(kind: str, factory: Callable[..., ManagedObjectStore]) -> None:
    """Use ``factory`` for stages of ``kind`` (embedders, tests); it wins over the table."""
    _FACTORIES[kind] = factory


def _factory(kind: str) -> Callable[..., ManagedObjectStore]:
    found = _FACTORIES.get(kind)
    if found is not None:
        return found
    path = STORE_IMPLEMENTATIONS.get(kind)
    if path is None:
        raise InvalidArgument(f"no object store for stage kind {kind!r}")
    module, _, attribute = path.partition(":")
    factory: Callable[..., ManagedObjectStore] = getattr(importlib.import_module(module), attribute)
    return factory


def open_store(descriptor: StageDescriptor, **options: Any) -> ManagedObjectStore:
    """The store for a descriptor: local files or S3 with this process's credentials."""
    return _factory(descriptor.kind)(descriptor, **options)


def checkpoint_path(value: str | os.PathLike[str] | None) -> Path | None:
    return None if value is None else Path(value).expanduser().absolute()
