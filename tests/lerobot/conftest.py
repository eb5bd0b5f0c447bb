"""LeRobot tests share one Lake per module (the recordings tests' fixture); one on SeaweedFS S3."""

from __future__ import annotations

from tests.recordings.conftest import s3_lake, shared_lake  # noqa: F401
