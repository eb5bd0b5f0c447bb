"""LeRobot tests share one Lake per module (the recordings tests' fixture)."""

from __future__ import annotations

from tests.recordings.conftest import shared_lake  # noqa: F401
