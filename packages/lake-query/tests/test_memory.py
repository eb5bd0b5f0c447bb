"""Allocator thresholds for a streaming server process."""

from __future__ import annotations

import platform

import pytest

from lake_query.serving.memory import tune_allocator


def test_operator_malloc_settings_win() -> None:
    assert tune_allocator({"MALLOC_MMAP_THRESHOLD_": "131072"}) is False
    assert tune_allocator({"MALLOC_TRIM_THRESHOLD_": "131072"}) is False


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_thresholds_are_set_on_glibc() -> None:
    assert tune_allocator({}) is True
