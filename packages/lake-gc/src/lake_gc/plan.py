"""Planning: an immutable, content-addressed plan of what GC may delete.

    PLAN_DIR/
      pages/<sha256>.txt   candidate pages: one entry per line, at most page_size lines
      manifest.json        published last: {"manifest": {...}, "sha256": <plan id>}

In order (nothing is deleted, ever)::

    read the registry roots (heads, dropped incarnations, generation)
    lineage: every live URI from the sidecars -> external sort        (bounded memory)
    inventory: every stage entry (paged on S3) -> external sort       (bounded memory)
    merge the two sorted streams: an entry is a candidate when no live
      URI names it and it is older than the safety age (cut-off = now - age)
    write each candidate page, fsync'd, named by its SHA-256
    read the roots again: another registry -> fail (commits are fine: the
      plan binds the first roots, and apply keeps whatever a version after
      them references, lake_gc.since)
    re-read and validate every page (hash, parse, stage, age)
    publish manifest.json (atomic rename, fsync'd): the plan exists from here

The manifest binds the stage, the sidecar location and the roots; its
SHA-256 is the plan id an apply checkpoint names. A plan directory is never
reused: planning into a non-empty directory is refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lake_core.durable import fsync_dir, replace_synced
from lake_core.errors import DataCorrupted, FailedPrecondition, InvalidArgument, Unavailable
from lake_gc.lineage import SidecarSource, collect_live
from lake_gc.roots import RegistryRoots, RootsSource
from lake_gc.sorter import ExternalSorter
from lake_gc.stage import Entry, ManagedStage, has_control_chars

__all__ = [
    "MANIFEST",
    "PAGE_SIZE",
    "CandidatePage",
    "Plan",
    "PlanManifest",
    "disk_error",
    "load_plan",
    "make_plan",
]

MANIFEST = "manifest.json"
PAGES = "pages"
#: Candidates per page: one fsync'd checkpoint step of apply (S3 deletes 1,000 per call).
PAGE_SIZE = 1000

#: ``progress(phase, done)``: phase is "inventory" or "candidates".
Progress = Callable[[str, int], None]


class CandidatePage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    entries: int = Field(ge=1)
    bytes: int = Field(ge=0)


class Totals(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: int = 0
    bytes: int = 0


class PlanManifest(BaseModel):
    """Everything a plan binds and holds (the pages by hash)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    created_at_ms: int
    safety_age_secs: int
    #: Entries modified at or after this instant are never candidates.
    cutoff_ms: int
    stage: str
    sidecars: str
    roots: RegistryRoots
    lineage_sidecars: int
    lineage_digest: str
    live_uris: int
    inventory: Totals
    inventory_digest: str
    young: Totals
    referenced: Totals
    candidates: Totals
    candidates_by_kind: dict[str, int]
    pages: list[CandidatePage]


@dataclass(frozen=True)
class Plan:
    """A published plan: where it is, its id and its manifest."""

    directory: Path
    plan_id: str
    manifest: PlanManifest

    def page_path(self, page: CandidatePage) -> Path:
        return self.directory / PAGES / f"{page.sha256}.txt"

    def read_page(self, page: CandidatePage, stage: ManagedStage) -> list[Entry]:
        """A page's entries, refused unless every byte and entry checks out."""
        try:
            data = self.page_path(page).read_bytes()
        except FileNotFoundError:
            raise DataCorrupted(f"plan {self.directory} lacks page {page.sha256}") from None
        return _validated_page(data, page, self.manifest, stage)

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "plan": str(self.directory),
            "plan_id": self.plan_id,
            "candidates": m.candidates.entries,
            "candidate_bytes": m.candidates.bytes,
            "candidates_by_kind": m.candidates_by_kind,
            "pages": len(m.pages),
            "inventory": m.inventory.entries,
            "referenced": m.referenced.entries,
            "younger_than_safety_age": m.young.entries,
            "live_uris": m.live_uris,
            "sidecars": m.lineage_sidecars,
            "safety_age_secs": m.safety_age_secs,
            "stage": m.stage,
            "generation": m.roots.generation,
        }


def _canonical(manifest: PlanManifest) -> bytes:
    return json.dumps(
        manifest.model_dump(mode="json"), sort_keys=True, separators=(",", ":")
    ).encode()


def _validated_page(
    data: bytes, page: CandidatePage, manifest: PlanManifest, stage: ManagedStage
) -> list[Entry]:
    if hashlib.sha256(data).hexdigest() != page.sha256:
        raise DataCorrupted(f"candidate page {page.sha256} does not match its hash")
    try:
        entries = [Entry.from_line(line) for line in data.decode().splitlines()]
    except (ValueError, UnicodeDecodeError):
        raise DataCorrupted(f"candidate page {page.sha256} is malformed") from None
    if len(entries) != page.entries or sum(e.size for e in entries) != page.bytes:
        raise DataCorrupted(f"candidate page {page.sha256} disagrees with the manifest")
    for entry in entries:
        if not stage.owns(entry.uri) or entry.modified_ms >= manifest.cutoff_ms:
            raise DataCorrupted(f"candidate page {page.sha256} holds an entry GC may not delete")
    return entries


def make_plan(
    directory: Path,
    *,
    roots: RootsSource,
    sidecars: SidecarSource,
    stage: ManagedStage,
    safety_age_secs: int,
    page_size: int = PAGE_SIZE,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.time,
) -> Plan:
    """Plan into the new directory ``directory``; returns the published plan."""
    if directory.exists() and any(directory.iterdir()):
        if not _unpublished(directory):
            raise FailedPrecondition(
                f"plan directory {directory} is not empty: a plan is immutable, choose a new path"
            )
        _discard(directory, created=False)  # a killed planner's debris: never a plan
    created = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise disk_error(exc, f"cannot create the plan directory {directory}") from None
    try:
        return _plan(directory, roots, sidecars, stage, safety_age_secs, page_size, progress, clock)
    except OSError as exc:
        _discard(directory, created)
        raise disk_error(exc, f"planning into {directory} failed on {exc.filename}") from None
    except BaseException:
        _discard(directory, created)
        raise


#: What a planner writes before it publishes: its work dir, pages, temporary files.
_DEBRIS = re.compile(r"\.work-.+|\..+\.\d+\.tmp")
_PAGE = re.compile(r"[0-9a-f]{64}\.txt|\.[0-9a-f]{64}\.txt\.\d+\.tmp")


def _unpublished(directory: Path) -> bool:
    """Whether ``directory`` holds only what a planner killed before publishing left.

    No manifest means no plan: apply refuses it, so clearing it loses nothing,
    and re-running the same command after a SIGKILL plans again.
    """
    for child in directory.iterdir():
        if child.name == PAGES and child.is_dir() and not child.is_symlink():
            if not all(_PAGE.fullmatch(page.name) for page in child.iterdir()):
                return False
        elif not _DEBRIS.fullmatch(child.name) or child.is_symlink():
            return False
    return True


def _discard(directory: Path, created: bool) -> None:
    """Never published (no manifest): remove what we wrote, so the path is reusable."""
    if created:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for child in directory.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink()


#: A path the operator gave that cannot be used: their mistake, not a storage fault.
_BAD_PATH = {errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS}


def disk_error(exc: OSError, what: str) -> InvalidArgument | Unavailable:
    """A plan or checkpoint path's failure, typed: a path that cannot be used (the
    caller's) or a disk fault such as a full disk (retryable)."""
    if exc.errno in _BAD_PATH:
        return InvalidArgument(f"{what}: {exc.strerror}")
    return Unavailable(f"{what}: {exc.strerror}; retry")


def _plan(
    directory: Path,
    roots_source: RootsSource,
    sidecars: SidecarSource,
    stage: ManagedStage,
    safety_age_secs: int,
    page_size: int,
    progress: Progress | None,
    clock: Callable[[], float],
) -> Plan:
    now_ms = int(clock() * 1000)
    cutoff_ms = now_ms - safety_age_secs * 1000
    roots = roots_source.read()
    pages_dir = directory / PAGES
    pages_dir.mkdir()
    with tempfile.TemporaryDirectory(prefix=".work-", dir=directory) as work:
        live = ExternalSorter(Path(work))
        lineage = collect_live(sidecars, roots, live, stage_uri=stage.managed_uri)
        inventory = ExternalSorter(Path(work))
        inventory_hash = hashlib.sha256()
        count, size = 0, 0
        for entry in stage.entries():
            if has_control_chars(entry.uri) or not stage.owns(entry.uri):
                continue  # no URI of ours looks like this: never a candidate
            inventory.add(entry.line())
            count, size = count + 1, size + entry.size
            if progress is not None and count % 1000 == 0:
                progress("inventory", count)
        inventory_totals = Totals(entries=count, bytes=size)
        if progress is not None:
            progress("inventory", count)
        joined = _join(inventory.merged(), live.merged(), cutoff_ms, inventory_hash)
        pages, young, referenced, by_kind, live_count = _write_pages(
            pages_dir, joined, page_size, progress
        )
    fsync_dir(pages_dir)
    after = roots_source.read()
    if (
        after.registry != roots.registry
        or after.generation.rpartition(":")[0] != (roots.generation.rpartition(":")[0])
    ):
        raise FailedPrecondition(
            "the registry GC reads was replaced while planning; plan again into a new directory"
        )
    manifest = PlanManifest(
        created_at_ms=now_ms,
        safety_age_secs=safety_age_secs,
        cutoff_ms=cutoff_ms,
        stage=stage.base_uri,
        sidecars=sidecars.location,
        roots=roots,
        lineage_sidecars=lineage.sidecars,
        lineage_digest=lineage.digest,
        live_uris=live_count.entries,
        inventory=inventory_totals,
        inventory_digest=inventory_hash.hexdigest(),
        young=young,
        referenced=referenced,
        candidates=Totals(entries=sum(p.entries for p in pages), bytes=sum(p.bytes for p in pages)),
        candidates_by_kind=by_kind,
        pages=pages,
    )
    plan = Plan(directory, hashlib.sha256(_canonical(manifest)).hexdigest(), manifest)
    for page in pages:  # every page validated before the manifest names it
        plan.read_page(page, stage)
    body = json.dumps(
        {"manifest": manifest.model_dump(mode="json"), "sha256": plan.plan_id},
        sort_keys=True,
        indent=1,
    ).encode()
    replace_synced(directory / MANIFEST, [body], mode=0o644)
    return plan


@dataclass
class _Joined:
    entry: Entry
    state: Literal["candidate", "referenced", "young"]


class _LiveCount:
    def __init__(self) -> None:
        self.entries = 0


def _join(
    inventory: Iterator[str], live: Iterator[str], cutoff_ms: int, digest: Any
) -> Iterator[_Joined | _LiveCount]:
    """Merge sorted inventory lines with sorted live URIs (both ascending by URI)."""
    counter = _LiveCount()
    head = next(live, None)
    if head is not None:
        counter.entries += 1
    for line in inventory:
        digest.update(line.encode() + b"\n")
        entry = Entry.from_line(line)
        while head is not None and head < entry.uri:
            head = next(live, None)
            if head is not None:
                counter.entries += 1
        if head == entry.uri:
            yield _Joined(entry, "referenced")
        elif entry.modified_ms >= cutoff_ms:
            yield _Joined(entry, "young")
        else:
            yield _Joined(entry, "candidate")
    for _ in live:
        counter.entries += 1
    yield counter


def _write_pages(
    pages_dir: Path,
    joined: Iterator[_Joined | _LiveCount],
    page_size: int,
    progress: Progress | None,
) -> tuple[list[CandidatePage], Totals, Totals, dict[str, int], _LiveCount]:
    pages: list[CandidatePage] = []
    young = [0, 0]
    referenced = [0, 0]
    by_kind: dict[str, int] = {}
    live_count = _LiveCount()
    current: list[Entry] = []

    def flush() -> None:
        data = "".join(e.line() + "\n" for e in current).encode()
        sha = hashlib.sha256(data).hexdigest()
        replace_synced(pages_dir / f"{sha}.txt", [data], mode=0o644, sync_dir=False)
        pages.append(
            CandidatePage(sha256=sha, entries=len(current), bytes=sum(e.size for e in current))
        )
        current.clear()
        if progress is not None:
            progress("candidates", sum(p.entries for p in pages))

    for item in joined:
        if isinstance(item, _LiveCount):
            live_count = item
            continue
        if item.state == "referenced":
            referenced[0] += 1
            referenced[1] += item.entry.size
        elif item.state == "young":
            young[0] += 1
            young[1] += item.entry.size
        else:
            current.append(item.entry)
            by_kind[item.entry.kind] = by_kind.get(item.entry.kind, 0) + 1
            if len(current) >= page_size:
                flush()
    if current:
        flush()
    return (
        pages,
        Totals(entries=young[0], bytes=young[1]),
        Totals(entries=referenced[0], bytes=referenced[1]),
        by_kind,
        live_count,
    )


def load_plan(directory: Path) -> Plan:
    """The published plan in ``directory``, refused unless its manifest checks out."""
    try:
        raw = json.loads((directory / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise FailedPrecondition(
            f"{directory} holds no published plan (no {MANIFEST}); run `lake gc --plan` first"
        ) from None
    except (ValueError, UnicodeDecodeError):
        raise DataCorrupted(f"the manifest of plan {directory} is not JSON") from None
    try:
        manifest = PlanManifest.model_validate(raw["manifest"])
        claimed = str(raw["sha256"])
    except (KeyError, TypeError, ValidationError):
        raise DataCorrupted(f"the manifest of plan {directory} is malformed") from None
    plan_id = hashlib.sha256(_canonical(manifest)).hexdigest()
    if plan_id != claimed:
        raise DataCorrupted(f"the manifest of plan {directory} does not match its hash")
    return Plan(directory, plan_id, manifest)
