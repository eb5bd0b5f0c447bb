"""Lineage: the live URI set, from reference-delta sidecars (never table rows).

For each incarnation with sidecars:

- dropped in the registry: dead; its references keep nothing alive;
- live (a registry head names it): every URI any of its deltas adds is
  live, including deltas of versions past the head (a crash mid-commit
  wrote them; keeping more is safe). Its versions 0..head must each have a
  delta, or the plan fails closed: a missing sidecar is missing lineage;
- neither (a create racing the plan): treated as live.

Every delta is parsed and checked against where it was found before any of
its URIs count, and a live head without sidecars fails the plan.
:class:`SidecarSource` is the seam: the data directory or the S3 prefix.
"""

from __future__ import annotations

import abc
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lake_core.errors import DataCorrupted, FailedPrecondition
from lake_core.references import DROPPED_NAME, DropMarker, ReferenceDelta
from lake_gc.roots import RegistryRoots
from lake_gc.sorter import ExternalSorter
from lake_gc.stage import guarded, has_control_chars, s3_error

__all__ = [
    "Lineage",
    "LocalSidecars",
    "S3Sidecars",
    "SidecarSource",
    "collect_live",
    "parse_delta",
]

_LOCAL_NAME = re.compile(r"^(\d+)(?:\.m(\d+))?\.json$")
_S3_VERSION = re.compile(r"^\d{20}$")


class SidecarSource(abc.ABC):
    """Where the sidecars are: lists incarnations and yields their files (blocking)."""

    #: What a plan binds: ``file:///...`` or ``s3://bucket/prefix``.
    location: str

    @abc.abstractmethod
    def incarnations(self) -> Iterator[str]: ...

    @abc.abstractmethod
    def files(self, incarnation: str) -> Iterator[tuple[int | None, bytes]]:
        """``(version from the name, body)`` of every file; None for a drop marker."""

    def deltas_since(self, incarnation: str, start: int) -> Iterator[tuple[int, bytes]]:
        """``(version, body)`` of every delta of a version >= ``start`` (drop markers skipped).

        Implementations read only those bodies: apply calls this before every page.
        """
        for version, body in self.files(incarnation):
            if version is not None and version >= start:
                yield version, body


class LocalSidecars(SidecarSource):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.location = f"file://{root.resolve()}"

    def incarnations(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    yield entry.name

    def files(self, incarnation: str) -> Iterator[tuple[int | None, bytes]]:
        for path in sorted((self.root / incarnation).iterdir()):
            if path.name == DROPPED_NAME:
                yield None, path.read_bytes()
                continue
            if path.name.startswith(".") or not path.name.endswith(".json"):
                continue  # a writer's temporary file
            match = _LOCAL_NAME.match(path.name)
            if match is None:
                raise DataCorrupted(f"unexpected sidecar {path.name!r} of {incarnation}")
            yield int(match.group(1)), path.read_bytes()

    def deltas_since(self, incarnation: str, start: int) -> Iterator[tuple[int, bytes]]:
        directory = self.root / incarnation
        if not directory.is_dir():
            return
        for path in sorted(directory.iterdir()):
            match = _LOCAL_NAME.match(path.name)
            if match is None or int(match.group(1)) < start:
                continue  # older, a drop marker or a writer's temporary file
            try:
                body = path.read_bytes()
            except FileNotFoundError:
                continue  # a writer's retry replaced it; the replacement is listed too
            yield int(match.group(1)), body


class S3Sidecars(SidecarSource):
    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = f"s3://{bucket}/{self.prefix}"
        self._client = client

    def incarnations(self) -> Iterator[str]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/", Delimiter="/"
        )
        for page in guarded(pages, self.location):
            for common in page.get("CommonPrefixes", []):
                yield common["Prefix"][len(self.prefix) + 1 :].rstrip("/")

    def files(self, incarnation: str) -> Iterator[tuple[int | None, bytes]]:
        base = f"{self.prefix}/{incarnation}/"
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base
        )
        for page in guarded(pages, self.location):
            for item in page.get("Contents", []):
                rest = item["Key"][len(base) :]
                body = self._get(item["Key"])
                if rest == DROPPED_NAME:
                    yield None, body
                    continue
                version, _, name = rest.partition("/")
                if not _S3_VERSION.match(version) or not name.endswith(".json"):
                    raise DataCorrupted(f"unexpected sidecar key {item['Key'][:200]!r}")
                yield int(version), body

    def deltas_since(self, incarnation: str, start: int) -> Iterator[tuple[int, bytes]]:
        base = f"{self.prefix}/{incarnation}/"
        # Keys are <base><version, 20 digits>/<name>.json. Start after the version
        # before ``start`` (not at ``start`` itself: a filer-backed store such as
        # SeaweedFS skips the whole "directory" named by StartAfter); the check
        # below drops anything older that a store still lists.
        kwargs = {"Bucket": self.bucket, "Prefix": base}
        if start > 0:
            kwargs["StartAfter"] = f"{base}{start - 1:020d}"
        pages = self._client.get_paginator("list_objects_v2").paginate(**kwargs)
        for page in guarded(pages, self.location):
            for item in page.get("Contents", []):
                version, _, name = item["Key"][len(base) :].partition("/")
                if not _S3_VERSION.match(version) or not name.endswith(".json"):
                    continue  # the drop marker (its own name) or not a delta
                if int(version) >= start:
                    yield int(version), self._get(item["Key"])

    def _get(self, key: str) -> bytes:
        try:
            body: bytes = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            raise s3_error(exc, self.location) from None
        return body


@dataclass
class Lineage:
    """What the traversal read: counts, and a digest of every sidecar it accepted."""

    incarnations: int = 0
    dead_incarnations: int = 0
    sidecars: int = 0
    references: int = 0
    hasher: Any = field(default_factory=hashlib.sha256, repr=False)

    @property
    def digest(self) -> str:
        return str(self.hasher.hexdigest())


def collect_live(
    source: SidecarSource, roots: RegistryRoots, live: ExternalSorter, *, stage_uri: str
) -> Lineage:
    """Add every live URI to ``live``; fail closed on any inconsistent lineage.

    Every live URI must lie in ``stage_uri`` (the managed area GC inventories):
    Metasrv only accepts FILE values inside its own stage, so one outside means
    GC was given the stage under another name (a symlinked or relative
    ``--data-dir``, another ``LAKE_MANAGED_OBJECT_ROOT`` spelling). Its objects
    would then match no reference and all become candidates.
    """
    heads = {t.incarnation: t for t in roots.tables}
    dropped = set(roots.dropped)
    lineage = Lineage()
    seen: set[str] = set()
    for incarnation in sorted(source.incarnations()):
        lineage.incarnations += 1
        seen.add(incarnation)
        if incarnation in dropped:
            lineage.dead_incarnations += 1
            continue
        versions: set[int] = set()
        for version, body in source.files(incarnation):
            lineage.sidecars += 1
            lineage.hasher.update(hashlib.sha256(body).digest())
            if version is None:
                # A marker without the registry's drop record: keep its objects.
                _parse_marker(body, incarnation)
                continue
            delta = parse_delta(body, incarnation, version)
            versions.add(version)
            for uri in delta.adds:
                if has_control_chars(uri):
                    raise DataCorrupted(f"a sidecar of {incarnation} holds a malformed URI")
                if not uri.startswith(stage_uri):
                    head = heads.get(incarnation)
                    owner = f"table {head.table}" if head else f"incarnation {incarnation}"
                    raise _outside_stage(owner, uri, stage_uri)
                live.add(uri)
                lineage.references += 1
        head = heads.get(incarnation)
        if head is not None:
            missing = next((v for v in range(head.version + 1) if v not in versions), None)
            if missing is not None:
                raise FailedPrecondition(
                    f"table {head.table} version {missing} has no reference-delta sidecar; "
                    "GC cannot know what it references and fails closed"
                )
    for head in roots.tables:
        if head.incarnation not in seen:
            raise FailedPrecondition(
                f"table {head.table} has no reference-delta sidecars; GC fails closed"
            )
    return lineage


def _outside_stage(owner: str, uri: str, stage_uri: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"{owner} references {uri[:200]!r}, outside the managed stage GC "
        f"was given ({stage_uri[:200]}): run GC with the stage exactly as Metasrv names it "
        "(the same --data-dir or LAKE_MANAGED_OBJECT_ROOT path, not a symlink or relative "
        "path to it); GC fails closed"
    )


def parse_delta(body: bytes, incarnation: str, version: int) -> ReferenceDelta:
    try:
        delta = ReferenceDelta.model_validate_json(body)
    except ValidationError:
        raise DataCorrupted(f"sidecar {incarnation}/{version} is not a reference delta") from None
    if delta.incarnation != incarnation or delta.version != version:
        raise DataCorrupted(f"sidecar {incarnation}/{version} names another version")
    return delta


def _parse_marker(body: bytes, incarnation: str) -> DropMarker:
    try:
        marker = DropMarker.model_validate_json(body)
    except ValidationError:
        raise DataCorrupted(f"drop marker of {incarnation} is malformed") from None
    if marker.incarnation != incarnation:
        raise DataCorrupted(f"drop marker of {incarnation} names another incarnation")
    return marker
