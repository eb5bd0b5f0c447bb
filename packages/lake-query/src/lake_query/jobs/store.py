"""The async state store seam: small JSON documents under compare-and-swap.

Jobs, their active index, tenant slots and the fleet execution lease are all
single documents addressed by ``(family, key)``; every write is one
conditional write on the document's revision (the registry's rule: no
transactions, so dynalite and DynamoDB behave the same). Two
implementations side by side: :class:`LocalStateStore` (a directory, shared
by the replicas of one machine through a file lock) and
:class:`~lake_query.jobs.dynamo.DynamoStateStore`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lake_core.durable import fsync_dir

__all__ = ["ACTIVE", "JOBS", "LEASES", "SLOTS", "Document", "LocalStateStore", "StateStore"]

#: Families of documents.
JOBS = "job"
ACTIVE = "active"  # one per non-terminal job: what workers scan
SLOTS = "slots"  # one per tenant key: its outstanding job ids
LEASES = "lease"  # the fleet-wide execution lease

_NAME = re.compile(r"[a-z]{1,16}")
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,128}")

#: A stored document and the revision a conditional write must name.
Document = tuple[dict[str, Any], int]


def check_address(family: str, key: str) -> None:
    if not _NAME.fullmatch(family) or not _KEY.fullmatch(key):
        raise ValueError(f"bad state address {family!r}/{key[:40]!r}")


class StateStore(abc.ABC):
    """Documents with revisions; ``write`` succeeds only against the expected revision."""

    @abc.abstractmethod
    async def read(self, family: str, key: str) -> Document | None:
        """The document and its revision, or None (strongly consistent)."""

    @abc.abstractmethod
    async def write(self, family: str, key: str, doc: dict[str, Any], expect: int | None) -> bool:
        """Store ``doc`` at revision ``expect + 1`` (``expect=None``: only if absent).

        False when another writer got there first.
        """

    @abc.abstractmethod
    async def remove(self, family: str, key: str, expect: int | None = None) -> bool:
        """Delete the document (at revision ``expect`` when given)."""

    @abc.abstractmethod
    async def keys(self, family: str, after: str | None, limit: int) -> list[str]:
        """Up to ``limit`` keys of ``family`` after ``after``, in key order (a bounded page)."""

    async def close(self) -> None:  # noqa: B027 - optional
        pass


class LocalStateStore(StateStore):
    """``<root>/<family>/<key>.json``, written by rename, under one lock file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._lock_path = root / ".lock"
        self._local = asyncio.Lock()

    def __repr__(self) -> str:
        return f"LocalStateStore({str(self.root)!r})"

    def _path(self, family: str, key: str) -> Path:
        check_address(family, key)
        return self.root / family / f"{key}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # flock serializes the replicas sharing this directory.
        with open(self._lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @staticmethod
    def _load(path: Path) -> Document | None:
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        return data["doc"], int(data["rev"])

    async def read(self, family: str, key: str) -> Document | None:
        return await asyncio.to_thread(self._load, self._path(family, key))

    def _write(self, path: Path, doc: dict[str, Any], expect: int | None) -> bool:
        with self._locked():
            current = self._load(path)
            if (current is None) != (expect is None):
                return False
            if current is not None and current[1] != expect:
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            with open(temp, "wb") as out:
                out.write(json.dumps({"doc": doc, "rev": (expect or 0) + 1}).encode())
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
            fsync_dir(path.parent)
            return True

    async def write(self, family: str, key: str, doc: dict[str, Any], expect: int | None) -> bool:
        path = self._path(family, key)
        async with self._local:
            return await asyncio.to_thread(self._write, path, doc, expect)

    def _remove(self, path: Path, expect: int | None) -> bool:
        with self._locked():
            current = self._load(path)
            if current is None or (expect is not None and current[1] != expect):
                return False
            path.unlink()
            fsync_dir(path.parent)
            return True

    async def remove(self, family: str, key: str, expect: int | None = None) -> bool:
        path = self._path(family, key)
        async with self._local:
            return await asyncio.to_thread(self._remove, path, expect)

    def _keys(self, family: str, after: str | None, limit: int) -> list[str]:
        folder = self.root / family
        try:
            names = sorted(p.name[: -len(".json")] for p in folder.glob("*.json"))
        except FileNotFoundError:
            return []
        return [n for n in names if after is None or n > after][:limit]

    async def keys(self, family: str, after: str | None, limit: int) -> list[str]:
        return await asyncio.to_thread(self._keys, family, after, limit)
