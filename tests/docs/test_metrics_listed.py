"""docs/operations.md lists every series Lake records (lake_core.telemetry.series)."""

from __future__ import annotations

import re
from pathlib import Path

from lake_core.telemetry import series
from lake_core.telemetry.metrics import Counter, Gauge, Histogram

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def listed() -> set[str]:
    """Names in the metrics table; ```a_b_c` / `_d``` lists ``a_b_c`` and ``a_b_d``."""
    names: set[str] = set()
    for line in PAGE.read_text().splitlines():
        if not line.startswith("| `lake_"):
            continue
        cell = line.split("|")[1]
        first, *others = re.findall(r"`([a-z_]+)`", cell)
        names.add(first)
        words = first.split("_")
        for other in others:
            tail = other.lstrip("_").split("_")
            names.add("_".join(words[: len(words) - len(tail)] + tail))
    return names


def test_every_series_is_in_the_operations_page() -> None:
    declared = {
        metric.name
        for metric in vars(series).values()
        if isinstance(metric, Counter | Gauge | Histogram)
    }
    assert "lake_query_scan_cache_lookups_total" in declared
    assert declared - listed() == set()
