"""Tiny LeRobot v3.0 datasets for tests: :mod:`lake_sdk.lerobot.sample` (pyarrow and PyAV)."""

from __future__ import annotations

from lake_sdk.lerobot.sample import CAMERAS, TASKS, DatasetSpec, write_dataset

__all__ = ["CAMERAS", "TASKS", "DatasetSpec", "write_dataset"]
