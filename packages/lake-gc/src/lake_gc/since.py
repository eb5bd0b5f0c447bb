"""What commits since a plan reference: the objects apply must not delete.

A plan lists objects that no sidecar named when it was made and that were
older than its safety age. A fleet keeps appending while apply runs, so
before every page apply reads the registry roots again and, for each table
whose head moved since the plan (or that is new since), the reference-delta
sidecars of every version after the planned head: the ones the registry now
points at and those a commit in flight already wrote (Metasrv writes a
version's sidecar, durably, before the registry can point at it). Every URI
they add is taken out of the page. So a commit that is visible, or even
only under way, when a page starts can never lose an object to that page.

The one window left is a commit whose sidecar appears while a page is being
deleted. It could only name a page's object by newly referencing an object
older than the safety age, which the safety-age contract forbids (docs/gc.md);
before this module, apply relied on exactly the same contract for commits
landing during a page (its staleness check also ran between pages).

Nothing here trusts a head that went backwards, a registry that is not the
plan's, or a version the registry points at without a sidecar: each fails
closed with FailedPrecondition, deleting nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lake_core.errors import DataCorrupted, FailedPrecondition
from lake_gc.lineage import SidecarSource, parse_delta
from lake_gc.roots import RegistryRoots, TableRoot
from lake_gc.stage import has_control_chars

__all__ = ["SincePlan"]


def _registry_id(roots: RegistryRoots) -> str:
    return roots.generation.rpartition(":")[0]


@dataclass
class SincePlan:
    """The URIs added by versions committed (or being committed) after a plan's roots.

    Call :meth:`refresh` before each page; a version's sidecars are read until
    a refresh reads them with the version registered, never after, so a long
    apply under ingest reads each new sidecar about once.
    """

    planned: RegistryRoots
    sidecars: SidecarSource
    uris: set[str] = field(default_factory=set)
    #: incarnation -> versions whose sidecars were read.
    _read: dict[str, set[int]] = field(default_factory=dict)
    #: incarnation -> versions read while registered: their sidecars no longer change.
    _final: dict[str, set[int]] = field(default_factory=dict)
    _heads: dict[str, TableRoot] = field(init=False)

    def __post_init__(self) -> None:
        self._heads = {t.incarnation: t for t in self.planned.tables}

    def refresh(self, now: RegistryRoots) -> set[str]:
        """Read what changed up to ``now`` (the roots just read); return every URI added since."""
        if now.registry != self.planned.registry or _registry_id(now) != _registry_id(self.planned):
            raise FailedPrecondition(
                f"the plan was made against registry {self.planned.registry}, "
                f"this is {now.registry}; plan again"
            )
        if now == self.planned:
            return self.uris
        for head in now.tables:
            planned = self._heads.get(head.incarnation)
            if planned is not None and head.version < planned.version:
                raise FailedPrecondition(
                    f"table {head.table} went back from version {planned.version} to "
                    f"{head.version} since the plan; GC fails closed"
                )
            start = 0 if planned is None else planned.version + 1
            self._read_since(head, start)
        return self.uris

    def _read_since(self, head: TableRoot, start: int) -> None:
        read = self._read.setdefault(head.incarnation, set())
        final = self._final.setdefault(head.incarnation, set())
        # Versions past the head too: a commit under way wrote its sidecar first.
        # Such a version is read again once registered: a retry of it writes its
        # sidecar again (a second S3 key, or a replaced local file) with other adds.
        for version, body in self.sidecars.deltas_since(head.incarnation, start):
            if version in final:
                continue  # read while registered: every sidecar it has was listed then
            delta = parse_delta(body, head.incarnation, version)
            for uri in delta.adds:
                if has_control_chars(uri):
                    raise DataCorrupted(f"a sidecar of {head.incarnation} holds a malformed URI")
                self.uris.add(uri)
            read.add(version)
        final.update(v for v in read if v <= head.version)
        missing = next((v for v in range(start, head.version + 1) if v not in read), None)
        if missing is not None:
            raise FailedPrecondition(
                f"table {head.table} version {missing} (committed since the plan) has no "
                "reference-delta sidecar; GC cannot know what it references and fails closed"
            )
