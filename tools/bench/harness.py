"""Benchmark method: Lake against a reference measured in the same run.

Each figure alternates Lake (A) and its reference (B) run by run after a
warm-up of each, takes the median of each side, and reports the ratio in the
direction its goal is stated. Absolute numbers are printed for context only:
machines here are noisy, ratios from one run are what mean something.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["Figure", "machine", "measure", "timed"]

Direction = Literal["higher_is_better", "lower_is_better"]


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"


@dataclass(frozen=True)
class Figure:
    name: str
    lake: float
    reference: float
    unit: str
    ratio: float
    goal: str
    runs: int
    machine: str
    met: bool
    #: The goal expressed on the ratio's scale (None where it cannot be), for charts.
    threshold: float | None = None

    def json(self) -> str:
        return json.dumps(asdict(self))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(
    name: str,
    lake: Callable[[], float],
    reference: Callable[[], float],
    *,
    unit: str,
    goal: str,
    ratio_of: Callable[[float, float], float],
    met: Callable[[float, float, float], bool],
    runs: int = 5,
    warmup: int = 1,
    threshold: Callable[[float, float], float] | None = None,
) -> Figure:
    """Run A/B alternately; each callable returns one sample in ``unit``."""
    for _ in range(warmup):
        lake()
        reference()
    a: list[float] = []
    b: list[float] = []
    for i in range(runs):
        # Alternate which side goes first so drift does not favour either.
        if i % 2 == 0:
            a.append(lake())
            b.append(reference())
        else:
            b.append(reference())
            a.append(lake())
    lake_median = statistics.median(a)
    ref_median = statistics.median(b)
    ratio = ratio_of(lake_median, ref_median)
    return Figure(
        name=name,
        lake=round(lake_median, 4),
        reference=round(ref_median, 4),
        unit=unit,
        ratio=round(ratio, 3),
        goal=goal,
        runs=runs,
        machine=machine(),
        met=met(lake_median, ref_median, ratio),
        threshold=None if threshold is None else round(threshold(lake_median, ref_median), 3),
    )
