"""Reference-delta sidecars: the persisted format Metasrv writes and ``lake gc`` reads.

A sidecar records which managed-object URIs one table version adds (and
drops). A version holds a whole commit group of appends, so its delta is
merged: the union of their references, and the list of their operation ids. Metasrv writes one, durably, before the registry can point at the
version; the garbage collector and ``$versions`` read them, never table rows.

Layouts (one per sidecar store)::

    local  <data-dir>/sidecars/<incarnation>/<version>.json          create (0), appends
           <data-dir>/sidecars/<incarnation>/<version>.m<ev>.json    a maintenance commit
           <data-dir>/sidecars/<incarnation>/dropped.json            after a drop
    s3     <prefix>/<incarnation>/<version:020d>/<operation-id or create>.json
           <prefix>/<incarnation>/<version:020d>/maintenance-<ev:020d>.json
           <prefix>/<incarnation>/dropped.json

Schema 1 deltas are creates and appends. Schema 2 adds ``engine_version``,
set exactly on a maintenance commit's (empty) delta: maintenance keeps the
Lake version and moves only the Lance version. Readers accept both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lake_core.names import TableRef

__all__ = [
    "DROPPED_NAME",
    "MAINTENANCE_KEY_PREFIX",
    "DropMarker",
    "ReferenceDelta",
    "local_sidecar_name",
    "s3_sidecar_key",
]

#: File (local) or key (S3) name of a dropped incarnation's marker.
DROPPED_NAME = "dropped.json"
#: Key-name prefix of a maintenance commit's delta on S3 (beside the version's own).
MAINTENANCE_KEY_PREFIX = "maintenance-"


class ReferenceDelta(BaseModel):
    """The managed-object URIs one table version adds and drops."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1, 2] = 1
    table: TableRef
    incarnation: str
    version: int = Field(ge=0)
    #: The first append the version holds (None: a create or maintenance);
    #: names the S3 object, so a retried version never overwrites another's.
    operation_id: str | None = None
    #: Every append the version holds (a commit group's merged delta), in
    #: commit order; empty in deltas written before commit groups.
    operation_ids: list[str] = Field(default_factory=list)
    adds: list[str]
    drops: list[str] = Field(default_factory=list)
    engine_version: int | None = None

    @model_validator(mode="after")
    def _schema_matches(self) -> ReferenceDelta:
        if (self.engine_version is not None) != (self.schema_version == 2):
            raise ValueError("engine_version is set exactly on schema_version 2 deltas")
        return self

    @classmethod
    def maintenance(
        cls, table: TableRef, incarnation: str, version: int, engine_version: int
    ) -> ReferenceDelta:
        """The empty delta of a maintenance commit (no FILE reference changes)."""
        return cls(
            schema_version=2,
            table=table,
            incarnation=incarnation,
            version=version,
            engine_version=engine_version,
            adds=[],
        )


class DropMarker(BaseModel):
    """Written after the registry dropped an incarnation: its references are dead."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    table: TableRef
    incarnation: str
    dropped_version: int
    dropped_at_ms: int


def local_sidecar_name(version: int, engine_version: int | None = None) -> str:
    """The file name of a delta inside ``<data-dir>/sidecars/<incarnation>/``."""
    if engine_version is not None:
        return f"{version}.m{engine_version}.json"
    return f"{version}.json"


def s3_sidecar_key(
    prefix: str,
    incarnation: str,
    version: int,
    operation_id: str | None,
    engine_version: int | None = None,
) -> str:
    """The S3 key of a delta (one object per version *and* operation)."""
    base = f"{prefix}/{incarnation}/{version:020d}"
    if engine_version is not None:
        return f"{base}/{MAINTENANCE_KEY_PREFIX}{engine_version:020d}.json"
    return f"{base}/{operation_id or 'create'}.json"
