"""Apply: delete a plan's candidates, page by page, resumable, while the fleet writes.

    load the plan; refuse it unless its manifest matches its hash
    refuse a plan for another stage or sidecar location
    load the checkpoint (refused unless it names this plan and checks out)
    for each page not yet done:
        read and validate the page (hash, entries, stage, age)
        read the registry roots; for every table that moved since the plan,
          read the sidecars of the versions after the planned head
          (lake_gc.since): every URI they add is kept, not deleted
        delete / abort the page's other entries (already absent: a success); fsync'd
        write the checkpoint (pages done, counts), fsync'd               <- resume point

Commits after the plan no longer make it stale: appends, compactions,
creates and drops go on while apply runs, and what they reference is taken
out of each page before it is deleted (see :mod:`lake_gc.since` for why that
is safe). Another registry, a head that went backwards or a registered
version without a sidecar still fail closed.

A SIGKILL between two checkpoints replays at most the page in flight, and
replaying a deletion is harmless; pages before the checkpoint are never
touched again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lake_core import faults
from lake_core.durable import replace_synced
from lake_core.errors import DataCorrupted, FailedPrecondition, InvalidArgument
from lake_gc.lineage import SidecarSource
from lake_gc.plan import Plan, disk_error
from lake_gc.roots import RootsSource
from lake_gc.since import SincePlan
from lake_gc.stage import ManagedStage

__all__ = ["ApplyResult", "Checkpoint", "apply_plan"]

#: ``progress(pages_done, pages_total)``
Progress = Callable[[int, int], None]


class Checkpoint(BaseModel):
    """How far an apply got: the pages done, in plan order, and what they deleted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    plan_id: str
    pages_done: int = Field(ge=0)
    deleted: int = Field(ge=0)
    absent: int = Field(ge=0)
    #: Candidates kept because a commit after the plan references them.
    newly_referenced: int = Field(default=0, ge=0)

    def seal(self) -> str:
        # Without the field while it is 0: checkpoints written before it existed still seal.
        skip = {"newly_referenced"} if self.newly_referenced == 0 else None
        body = json.dumps(
            self.model_dump(mode="json", exclude=skip), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(body.encode()).hexdigest()

    def write(self, path: Path) -> None:
        body = json.dumps({"checkpoint": self.model_dump(mode="json"), "sha256": self.seal()})
        try:
            replace_synced(path, [body.encode()], mode=0o644)
        except OSError as exc:
            done = f"{self.pages_done} pages are done; apply again to resume"
            raise disk_error(exc, f"cannot write checkpoint {path} ({done})") from None

    @classmethod
    def read(cls, path: Path, plan: Plan) -> Checkpoint:
        """The checkpoint at ``path`` (a fresh one if there is none), refused if tampered."""
        try:
            raw = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls(plan_id=plan.plan_id, pages_done=0, deleted=0, absent=0)
        except (ValueError, UnicodeDecodeError):
            raise DataCorrupted(f"checkpoint {path} is not JSON; refusing to resume") from None
        try:
            checkpoint = cls.model_validate(raw["checkpoint"])
            claimed = str(raw["sha256"])
        except (KeyError, TypeError, ValidationError):
            raise DataCorrupted(f"checkpoint {path} is malformed; refusing to resume") from None
        if checkpoint.seal() != claimed:
            raise DataCorrupted(f"checkpoint {path} does not match its hash; refusing to resume")
        if checkpoint.plan_id != plan.plan_id:
            raise FailedPrecondition(
                f"checkpoint {path} belongs to plan {checkpoint.plan_id[:12]}, "
                f"not {plan.plan_id[:12]}; use a new checkpoint file for this plan"
            )
        if checkpoint.pages_done > len(plan.manifest.pages):
            raise DataCorrupted(f"checkpoint {path} claims more pages than the plan has")
        return checkpoint


@dataclass(frozen=True)
class ApplyResult:
    plan_id: str
    pages: int
    resumed_from: int
    checkpoint: Checkpoint

    def summary(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "pages": self.pages,
            "resumed_from_page": self.resumed_from,
            "pages_done": self.checkpoint.pages_done,
            "deleted": self.checkpoint.deleted,
            "already_absent": self.checkpoint.absent,
            "kept_newly_referenced": self.checkpoint.newly_referenced,
            "complete": self.checkpoint.pages_done == self.pages,
        }


def apply_plan(
    plan: Plan,
    checkpoint_path: Path,
    *,
    roots: RootsSource,
    sidecars: SidecarSource,
    stage: ManagedStage,
    progress: Progress | None = None,
) -> ApplyResult:
    """Delete ``plan``'s candidates but those referenced since (see the module docstring)."""
    manifest = plan.manifest
    if manifest.stage != stage.base_uri or manifest.sidecars != sidecars.location:
        raise FailedPrecondition(
            f"plan {plan.directory} is for stage {manifest.stage}, not {stage.base_uri}"
        )
    checkpoint = Checkpoint.read(checkpoint_path, plan)
    if not checkpoint_path.parent.is_dir():
        # Refused before anything is deleted, not after the first page.
        raise InvalidArgument(f"checkpoint {checkpoint_path}: its directory does not exist")
    resumed_from = checkpoint.pages_done
    total = len(manifest.pages)
    since = SincePlan(manifest.roots, sidecars)
    for index in range(checkpoint.pages_done, total):
        page = manifest.pages[index]
        entries = plan.read_page(page, stage)
        referenced = _referenced_since(plan, roots, since, deleted_before=index > resumed_from)
        doomed = [e for e in entries if e.uri not in referenced]
        outcome = stage.delete(doomed)
        checkpoint = Checkpoint(
            plan_id=plan.plan_id,
            pages_done=index + 1,
            deleted=checkpoint.deleted + outcome.deleted,
            absent=checkpoint.absent + outcome.absent,
            newly_referenced=checkpoint.newly_referenced + len(entries) - len(doomed),
        )
        checkpoint.write(checkpoint_path)
        faults.crash(faults.GC_AFTER_APPLY_PAGE)
        if progress is not None:
            progress(index + 1, total)
    if total == 0 or resumed_from == total:
        # A no-op apply still refuses a plan of another registry.
        _referenced_since(plan, roots, since, deleted_before=False)
        if not checkpoint_path.exists():
            checkpoint.write(checkpoint_path)
    return ApplyResult(plan.plan_id, total, resumed_from, checkpoint)


def _referenced_since(
    plan: Plan, roots: RootsSource, since: SincePlan, *, deleted_before: bool
) -> set[str]:
    """Every URI a commit after the plan added; fails closed (saying what was done) otherwise."""
    try:
        return since.refresh(roots.read())
    except FailedPrecondition as exc:
        done = (
            "pages before this one were deleted (see the checkpoint)"
            if deleted_before
            else "nothing was deleted by this run"
        )
        raise FailedPrecondition(f"plan {plan.directory} cannot go on: {exc}; {done}") from None
