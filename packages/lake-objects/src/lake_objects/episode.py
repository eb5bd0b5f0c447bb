"""Episode bundles, v1: one Arrow row per robot episode with FILE columns for its artifacts.

The contract (``EPISODE_ARTIFACT_SCHEMA_V1``)::

    episode_id    utf8, not null      the episode's id
    robot_id      utf8, not null      which robot recorded it
    started_at    timestamp[us, UTC]  first sample
    ended_at      timestamp[us, UTC]  last sample (not before started_at)
    video         FILE                camera video
    point_cloud   FILE                lidar / depth point cloud
    telemetry     FILE                joint states, commands, logs
    schema_version int32, not null    always 1

Any artifact may be null. The bundle carries only DataLocations (metadata):
building and appending it needs no storage credentials, so a query-only
client can append it with ``append_batches``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lake_core.errors import InvalidArgument
from lake_core.filetype import FILE_STRUCT, file_field, location_to_row
from lake_core.models import DataLocation

__all__ = [
    "ARTIFACT_KINDS_V1",
    "EPISODE_ARTIFACT_SCHEMA_V1",
    "EpisodeBundle",
    "episode_artifact_table_v1",
]

ARTIFACT_KINDS_V1 = ("video", "point_cloud", "telemetry")
MAX_BUNDLES = 10_000

EPISODE_ARTIFACT_SCHEMA_V1 = pa.schema(
    [
        pa.field("episode_id", pa.utf8(), nullable=False),
        pa.field("robot_id", pa.utf8(), nullable=False),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        pa.field("ended_at", pa.timestamp("us", tz="UTC")),
        *(file_field(kind) for kind in ARTIFACT_KINDS_V1),
        pa.field("schema_version", pa.int32(), nullable=False),
    ]
)


class EpisodeBundle(BaseModel):
    """One episode and the DataLocations of its artifacts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    episode_id: str = Field(min_length=1, max_length=256)
    robot_id: str = Field(min_length=1, max_length=256)
    started_at: datetime
    ended_at: datetime
    video: DataLocation | None = None
    point_cloud: DataLocation | None = None
    telemetry: DataLocation | None = None

    @model_validator(mode="after")
    def _times(self) -> EpisodeBundle:
        if self.started_at.tzinfo is None or self.ended_at.tzinfo is None:
            raise ValueError("episode timestamps must be timezone-aware")
        if self.ended_at < self.started_at:
            raise ValueError("an episode cannot end before it starts")
        return self


def episode_artifact_table_v1(bundles: EpisodeBundle | Iterable[EpisodeBundle]) -> pa.RecordBatch:
    """The v1 record batch for one or more bundles (1..=10,000)."""
    items = [bundles] if isinstance(bundles, EpisodeBundle) else list(bundles)
    if not 1 <= len(items) <= MAX_BUNDLES:
        raise InvalidArgument(f"an episode batch holds 1..={MAX_BUNDLES} bundles, got {len(items)}")
    for item in items:
        if not isinstance(item, EpisodeBundle):
            raise InvalidArgument("episode_artifact_table_v1 takes EpisodeBundle values")
    columns: list[pa.Array] = [
        pa.array([b.episode_id for b in items], pa.utf8()),
        pa.array([b.robot_id for b in items], pa.utf8()),
        pa.array([b.started_at.astimezone(UTC) for b in items], pa.timestamp("us", tz="UTC")),
        pa.array([b.ended_at.astimezone(UTC) for b in items], pa.timestamp("us", tz="UTC")),
    ]
    for kind in ARTIFACT_KINDS_V1:
        values = [getattr(b, kind) for b in items]
        columns.append(
            pa.array([location_to_row(v) if v is not None else None for v in values], FILE_STRUCT)
        )
    columns.append(pa.array([1] * len(items), pa.int32()))
    return pa.RecordBatch.from_arrays(columns, schema=EPISODE_ARTIFACT_SCHEMA_V1)
