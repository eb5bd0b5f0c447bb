"""Fixtures for the training-data tests (shared servers live in open_file_support)."""

from tests.training.open_file_support import (  # noqa: F401 (fixtures)
    _local_stage_servers,
    _s3_stage_servers,
    local_stage,
    s3_stage,
)
