"""Benchmark method: Lake against references measured in the same run, pair by pair.

A figure runs Lake and its reference(s) alternately, one sample each per
round, after a warm-up round; the order rotates every round so drift on a
shared machine favours no side. Round *i* gives pair *i*: Lake's sample and
the reference's, and the pair's ratio ``lake / reference``. A figure reports
the median of the per-pair ratios and their interquartile range (and, for a
goal stated as a difference such as "+5 ms", the same of the per-pair
differences). Medians of each side are printed for context only.

How many pairs: at least :data:`MIN_PAIRS_SHORT` when a sample takes under
:data:`SHORT_SAMPLE_S` (decided from the first measured round), at least
:data:`MIN_PAIRS_LONG` otherwise. Quick runs ask for fewer on purpose: they
are smoke tests, not measurements.

Verdicts, on the goal's scale:

- ``met``: the median clears the goal, and the worse quartile (the lower one
  for an "at least" goal, the upper one for "at most") is within
  :data:`SPREAD_TOLERANCE` of the threshold;
- ``unsettled``: the median clears the goal but the worse quartile does not:
  the pairs do not settle it, so it is not met;
- ``missed``: the median does not clear the goal;
- ``n/a``: a figure reported for context, with no goal.

A reference that is computed rather than measured (a bound such as a memory
budget) is marked ``reference_kind="bound"``; the report labels it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

__all__ = [
    "MIN_PAIRS_LONG",
    "MIN_PAIRS_SHORT",
    "QUICK_PAIRS",
    "SHORT_SAMPLE_S",
    "SPREAD_TOLERANCE",
    "Figure",
    "Goal",
    "Samples",
    "Spread",
    "alternate",
    "at_least",
    "at_most",
    "figure",
    "machine",
    "measure",
    "min_pairs",
    "pair_differences",
    "pair_ratios",
    "pairs_for",
    "quartiles",
    "timed",
    "timed_threads",
    "verdict",
    "warmup_for",
]

Scale = Literal["ratio", "difference"]
Verdict = Literal["met", "unsettled", "missed", "n/a"]
ReferenceKind = Literal["measured", "bound"]

#: The worse quartile may lie this fraction of the threshold beyond it.
SPREAD_TOLERANCE = 0.10
#: Samples shorter than this need :data:`MIN_PAIRS_SHORT` pairs.
SHORT_SAMPLE_S = 1.0
MIN_PAIRS_SHORT = 15
MIN_PAIRS_LONG = 5
#: Pairs per figure in ``--quick`` runs, with no warm-up (a smoke test: verdicts mean
#: nothing there).
QUICK_PAIRS = 2


def machine() -> str:
    return (
        f"{platform.machine()} {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}"
    )


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_threads(targets: Sequence[Callable[[], object]]) -> float:
    """Seconds until ``targets``, a thread each and started together, have all ended.

    A failure of any is raised once every thread has ended (the first one).
    """
    errors: list[BaseException] = []

    def run(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # re-raised below, after every thread ends
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(target,)) for target in targets]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


# -- statistics ---------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """A median and its interquartile range."""

    median: float
    q1: float
    q3: float


def quartiles(values: Sequence[float]) -> Spread:
    """Median, first and third quartile (inclusive method: quartiles lie within the data)."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1:
        only = float(values[0])
        return Spread(only, only, only)
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return Spread(median, q1, q3)


def pair_ratios(lake: Sequence[float], reference: Sequence[float]) -> list[float]:
    """``lake[i] / reference[i]`` for each pair; a zero reference gives inf (or nan for 0/0)."""
    if len(lake) != len(reference):
        raise ValueError(f"{len(lake)} Lake samples but {len(reference)} reference samples")
    ratios = []
    for a, b in zip(lake, reference, strict=True):
        if b == 0:
            ratios.append(math.nan if a == 0 else math.copysign(math.inf, a))
        else:
            ratios.append(a / b)
    return ratios


def pair_differences(lake: Sequence[float], reference: Sequence[float]) -> list[float]:
    if len(lake) != len(reference):
        raise ValueError(f"{len(lake)} Lake samples but {len(reference)} reference samples")
    return [a - b for a, b in zip(lake, reference, strict=True)]


@dataclass(frozen=True)
class Goal:
    """A goal on the ratio's scale (or on the difference's, for "+5 ms" goals)."""

    text: str
    threshold: float
    higher_is_better: bool
    scale: Scale = "ratio"


def at_least(threshold: float, text: str, *, scale: Scale = "ratio") -> Goal:
    return Goal(text, threshold, higher_is_better=True, scale=scale)


def at_most(threshold: float, text: str, *, scale: Scale = "ratio") -> Goal:
    return Goal(text, threshold, higher_is_better=False, scale=scale)


def verdict(goal: Goal | None, spread: Spread) -> Verdict:
    """The verdict of ``spread`` (per-pair statistics on the goal's scale) against ``goal``."""
    if goal is None:
        return "n/a"
    if any(math.isnan(v) for v in (spread.median, spread.q1, spread.q3)):
        return "missed"
    slack = SPREAD_TOLERANCE * abs(goal.threshold)
    if goal.higher_is_better:
        clears = spread.median >= goal.threshold
        settled = spread.q1 >= goal.threshold - slack
    else:
        clears = spread.median <= goal.threshold
        settled = spread.q3 <= goal.threshold + slack
    if not clears:
        return "missed"
    return "met" if settled else "unsettled"


def min_pairs(sample_seconds: float) -> int:
    """The fewest pairs a figure needs when its slowest sample takes ``sample_seconds``."""
    return MIN_PAIRS_SHORT if sample_seconds < SHORT_SAMPLE_S else MIN_PAIRS_LONG


def pairs_for(quick: bool) -> int | None:
    """Pairs to ask :func:`measure` for: a few in quick runs, else the harness decides."""
    return QUICK_PAIRS if quick else None


def warmup_for(quick: bool) -> int:
    """Warm-up rounds: none in quick runs, one otherwise."""
    return 0 if quick else 1


# -- running ------------------------------------------------------------------


@dataclass(frozen=True)
class Samples:
    """One alternating run: each side's samples, in round order, and the machine's load."""

    sides: dict[str, list[float]]
    #: The 1-minute load average (``os.getloadavg``) after each round.
    load_1m: list[float] = field(default_factory=list)

    def __getitem__(self, side: str) -> list[float]:
        return self.sides[side]


def _load_1m() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return math.nan


def alternate(
    sides: Mapping[str, Callable[[], float]],
    *,
    pairs: int | None = None,
    warmup: int = 1,
    block: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Samples:
    """Run every side once per round, rotating the order, and keep each sample.

    Each callable returns one sample (in the figure's unit). With ``pairs``
    None the number of rounds is :func:`min_pairs` of the slowest sample of
    the first measured round (warm-up rounds are not kept, nor counted).

    With ``block`` > 1 a round runs the sides ``block`` times, interleaved
    (the order still rotating), and keeps the median of each side's values as
    its sample: a p50 per round. Millisecond samples need it when the effect
    sought (a few percent) is smaller than one call's jitter; interleaving
    inside the block keeps drift from favouring either side.
    """
    names = list(sides)
    if not names:
        raise ValueError("no sides to run")
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}")
    slowest = 0.0

    def one_round(i: int, keep: dict[str, list[float]] | None) -> None:
        nonlocal slowest
        values: dict[str, list[float]] = {name: [] for name in names}
        for j in range(block):
            shift = (i * block + j) % len(names)
            for name in names[shift:] + names[:shift]:
                began = clock()
                values[name].append(float(sides[name]()))
                slowest = max(slowest, clock() - began)
        if keep is not None:
            for name in names:
                keep[name].append(statistics.median(values[name]))

    for i in range(warmup):
        one_round(i, None)
    # Cold caches make warm-up samples slow: the first measured round decides.
    slowest = 0.0
    kept: dict[str, list[float]] = {name: [] for name in names}
    load: list[float] = []
    done = 0
    target = pairs
    while target is None or done < target:
        one_round(warmup + done, kept)
        load.append(_load_1m())
        done += 1
        if target is None:
            target = min_pairs(slowest)
    return Samples(kept, load)


@dataclass(frozen=True)
class Figure:
    """One line of the report: Lake against one reference over paired samples."""

    name: str
    unit: str
    #: Medians of each side's samples, for context.
    lake: float
    reference: float
    #: Median and quartiles of the per-pair ratios ``lake / reference``.
    ratio: float
    ratio_q1: float
    ratio_q3: float
    pairs: int
    goal: str
    verdict: Verdict
    machine: str
    #: "bound": the reference is computed (a budget), not measured.
    reference_kind: ReferenceKind = "measured"
    #: The goal's threshold, on its scale; None for report-only figures.
    threshold: float | None = None
    higher_is_better: bool | None = None
    scale: Scale = "ratio"
    #: Per-pair differences ``lake - reference`` (in ``unit``), for difference goals.
    difference: float | None = None
    difference_q1: float | None = None
    difference_q3: float | None = None
    cpus: int = 0
    load_1m_min: float | None = None
    load_1m_max: float | None = None

    @property
    def met(self) -> bool:
        return self.verdict == "met"

    def json(self) -> str:
        return json.dumps(asdict(self))


def _rounded(value: float, digits: int = 4) -> float:
    return value if math.isnan(value) or math.isinf(value) else round(value, digits)


def figure(
    name: str,
    lake: Sequence[float],
    reference: Sequence[float],
    *,
    unit: str,
    goal: Goal | None,
    load_1m: Sequence[float] = (),
    reference_kind: ReferenceKind = "measured",
    report_only: str = "report only",
) -> Figure:
    """The figure of paired samples ``lake[i]``, ``reference[i]`` against ``goal``."""
    ratios = quartiles(pair_ratios(lake, reference))
    differences = quartiles(pair_differences(lake, reference))
    judged = differences if goal is not None and goal.scale == "difference" else ratios
    loads = [v for v in load_1m if not math.isnan(v)]
    return Figure(
        name=name,
        unit=unit,
        lake=_rounded(statistics.median(lake)),
        reference=_rounded(statistics.median(reference)),
        ratio=_rounded(ratios.median, 3),
        ratio_q1=_rounded(ratios.q1, 3),
        ratio_q3=_rounded(ratios.q3, 3),
        pairs=len(lake),
        goal=goal.text if goal is not None else report_only,
        verdict=verdict(goal, judged),
        machine=machine(),
        reference_kind=reference_kind,
        threshold=None if goal is None else goal.threshold,
        higher_is_better=None if goal is None else goal.higher_is_better,
        scale="ratio" if goal is None else goal.scale,
        difference=_rounded(differences.median, 3) if judged is differences else None,
        difference_q1=_rounded(differences.q1, 3) if judged is differences else None,
        difference_q3=_rounded(differences.q3, 3) if judged is differences else None,
        cpus=os.cpu_count() or 0,
        load_1m_min=round(min(loads), 2) if loads else None,
        load_1m_max=round(max(loads), 2) if loads else None,
    )


def measure(
    name: str,
    lake: Callable[[], float],
    reference: Callable[[], float],
    *,
    unit: str,
    goal: Goal | None,
    pairs: int | None = None,
    warmup: int = 1,
    reference_kind: ReferenceKind = "measured",
    block: int = 1,
) -> Figure:
    """Alternate ``lake`` and ``reference`` (each returns one sample in ``unit``).

    ``block``: see :func:`alternate` (each pair then compares two p50s).
    """
    samples = alternate(
        {"lake": lake, "reference": reference}, pairs=pairs, warmup=warmup, block=block
    )
    return figure(
        name,
        samples["lake"],
        samples["reference"],
        unit=unit,
        goal=goal,
        load_1m=samples.load_1m,
        reference_kind=reference_kind,
    )
