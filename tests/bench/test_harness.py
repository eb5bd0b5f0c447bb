"""The benchmark harness's statistics: pair ratios, IQR, verdicts, n/a rows, pair counts."""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from pathlib import Path

import pytest

from tools.bench import harness
from tools.bench.harness import (
    Figure,
    Spread,
    alternate,
    at_least,
    at_most,
    figure,
    measure,
    min_pairs,
    pair_differences,
    pair_ratios,
    quartiles,
    timed_threads,
    verdict,
)
from tools.bench.report import load_figures, load_summary, render, result, write_report


def test_pair_ratios_are_per_pair_not_ratio_of_medians() -> None:
    lake = [10.0, 20.0, 30.0]
    ref = [5.0, 40.0, 10.0]
    assert pair_ratios(lake, ref) == [2.0, 0.5, 3.0]
    # The median of the ratios (2.0) is not the ratio of the medians (20 / 10).
    fig = figure("x", lake, ref, unit="s", goal=None)
    assert fig.ratio == 2.0
    assert fig.lake == 20.0
    assert fig.reference == 10.0


def test_pair_ratios_refuse_unpaired_samples_and_mark_zero_references() -> None:
    with pytest.raises(ValueError, match="2 Lake samples but 1"):
        pair_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        pair_differences([1.0], [])
    ratios = pair_ratios([1.0, 0.0], [0.0, 0.0])
    assert ratios[0] == math.inf
    assert math.isnan(ratios[1])
    assert pair_differences([5.0, 3.0], [1.0, 4.0]) == [4.0, -1.0]


def test_quartiles_inclusive_interquartile_range() -> None:
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == Spread(3.0, 2.0, 4.0)
    assert quartiles([4.0, 1.0, 3.0, 2.0]) == Spread(2.5, 1.75, 3.25)
    assert quartiles([7.0]) == Spread(7.0, 7.0, 7.0)
    with pytest.raises(ValueError):
        quartiles([])


@pytest.mark.parametrize(
    ("spread", "expected"),
    [
        (Spread(1.05, 0.95, 1.2), "met"),
        (Spread(1.0, 0.9, 1.1), "met"),  # exactly on the goal and on the tolerance
        (Spread(1.05, 0.89, 1.2), "unsettled"),  # lower quartile more than 10% below
        (Spread(0.99, 0.98, 1.0), "missed"),
        (Spread(math.nan, math.nan, math.nan), "missed"),
    ],
)
def test_verdict_at_least_judges_the_lower_quartile(spread: Spread, expected: str) -> None:
    assert verdict(at_least(1.0, ">= 1.0"), spread) == expected


@pytest.mark.parametrize(
    ("spread", "expected"),
    [
        (Spread(1.9, 1.5, 2.2), "met"),
        (Spread(1.9, 1.0, 2.21), "unsettled"),  # upper quartile beyond 2.2
        (Spread(2.01, 1.5, 2.1), "missed"),
        # The lower quartile never rescues nor fails an "at most" goal.
        (Spread(1.0, -50.0, 1.1), "met"),
    ],
)
def test_verdict_at_most_judges_the_upper_quartile(spread: Spread, expected: str) -> None:
    assert verdict(at_most(2.0, "<= 2x"), spread) == expected


def test_report_only_figures_are_na_whatever_their_numbers() -> None:
    assert verdict(None, Spread(0.001, 0.0, 0.002)) == "n/a"
    fig = figure("ctx", [1.0, 1.0], [100.0, 90.0], unit="x", goal=None)
    assert fig.verdict == "n/a"
    assert not fig.met
    assert fig.threshold is None
    assert fig.goal == "report only"
    assert result(fig) == "n/a"


def test_difference_goals_judge_per_pair_differences() -> None:
    goal = at_most(5.0, "<= +5 ms", scale="difference")
    # Ratios are large (slow reference is fast), but every pair is within +5 ms.
    fig = figure("p50", [4.0, 5.0, 6.0], [1.0, 1.0, 2.0], unit="ms", goal=goal)
    assert fig.difference == 4.0
    assert fig.difference_q3 == 4.0
    assert fig.ratio == 4.0
    assert fig.verdict == "met"
    worse = figure("p50", [7.0, 8.0, 9.0], [1.0, 1.0, 1.0], unit="ms", goal=goal)
    assert worse.verdict == "missed"
    # Ratio goals carry no difference fields.
    ratio_fig = figure("r", [2.0], [1.0], unit="ms", goal=at_most(3.0, "<= 3x"))
    assert ratio_fig.difference is None
    assert ratio_fig.verdict == "met"


def test_figure_verdict_uses_the_median_of_pairs_and_its_quartile() -> None:
    goal = at_least(1.0, ">= 1.0")
    # 15 pairs: median ratio 1.0, lower quartile 0.95: met.
    lake = [0.9] * 4 + [1.0] * 7 + [1.2] * 4
    ref = [1.0] * 15
    fig = figure("doget", lake, ref, unit="MiB/s", goal=goal)
    assert (fig.ratio, fig.ratio_q1, fig.ratio_q3) == (1.0, 0.95, 1.1)
    assert fig.pairs == 15
    assert fig.verdict == "met"
    # The same median with a long low tail (lower quartile 0.7 < 0.9): unsettled.
    lake = [0.7] * 6 + [1.0] * 4 + [1.2] * 5
    fig = figure("doget", lake, ref, unit="MiB/s", goal=goal)
    assert fig.ratio == 1.0
    assert fig.ratio_q1 == 0.7
    assert fig.verdict == "unsettled"


def test_bound_references_are_labelled_in_the_report() -> None:
    fig = figure(
        "rss", [260.0], [484.0], unit="MiB", goal=at_most(1.0, "<= 1"), reference_kind="bound"
    )
    page = render([fig])
    assert "| 484 (bound) |" in page
    measured = figure("r", [1.0], [2.0], unit="MiB", goal=None)
    assert "(bound)" not in render([measured]).split("| figure |")[1].split("\n\n")[0]


def test_min_pairs_depends_on_sample_length() -> None:
    assert min_pairs(0.2) == harness.MIN_PAIRS_SHORT == 15
    assert min_pairs(0.999) == 15
    assert min_pairs(1.0) == harness.MIN_PAIRS_LONG == 5
    assert min_pairs(30.0) == 5


def test_alternate_rotates_the_order_each_round() -> None:
    calls: list[str] = []
    values = itertools.count()

    def side(name: str):  # type: ignore[no-untyped-def]
        def run() -> float:
            calls.append(name)
            return float(next(values))

        return run

    samples = alternate({"a": side("a"), "b": side("b"), "c": side("c")}, pairs=3, warmup=1)
    # Warm-up round 0 starts with a, then each kept round starts one side later.
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert [len(v) for v in samples.sides.values()] == [3, 3, 3]
    assert samples["a"] == [5.0, 7.0, 9.0]
    assert len(samples.load_1m) == 3

    # Fast samples and no explicit count: the harness takes 15 pairs.
    quick = alternate({"a": lambda: 1.0, "b": lambda: 2.0})
    assert len(quick["a"]) == len(quick["b"]) == 15


def test_a_block_interleaves_the_sides_and_keeps_each_sides_median() -> None:
    calls: list[str] = []
    values = {"a": iter([9.0, 1.0, 2.0, 50.0, 3.0, 4.0]), "b": iter([7.0, 8.0, 6.0, 1.0, 1.0, 2.0])}

    def side(name: str):  # type: ignore[no-untyped-def]
        def run() -> float:
            calls.append(name)
            return next(values[name])

        return run

    samples = alternate({"a": side("a"), "b": side("b")}, pairs=2, warmup=0, block=3)
    # Within a block the order still rotates call by call, so neither side always goes first.
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    # One sample per round: the median of the side's three values, so one outlier (50) is dropped.
    assert samples["a"] == [2.0, 4.0]
    assert samples["b"] == [7.0, 1.0]
    with pytest.raises(ValueError, match="block"):
        alternate({"a": lambda: 1.0}, pairs=1, block=0)


def test_a_slow_warmup_does_not_decide_the_pair_count() -> None:
    # Clock readings: the warm-up round has two 5 s samples (cold caches), then 0.1 s ones.
    readings = [0.0, 5.0, 5.0, 10.0]
    fast = itertools.count(start=100, step=0.1)

    def clock() -> float:
        return readings.pop(0) if readings else float(next(fast))

    samples = alternate({"a": lambda: 1.0, "b": lambda: 1.0}, clock=clock)
    assert len(samples["a"]) == 15


def test_alternate_takes_five_pairs_of_long_samples() -> None:
    ticks = itertools.count(step=2)  # each clock reading 2 s after the last: long samples
    samples = alternate(
        {"a": lambda: 1.0, "b": lambda: 1.0}, warmup=0, clock=lambda: float(next(ticks))
    )
    assert len(samples["a"]) == 5


def test_measure_pairs_each_lake_sample_with_the_reference_of_its_round() -> None:
    lake = iter([100.0, 1.0, 2.0, 3.0])  # the first is the warm-up, dropped
    ref = iter([100.0, 2.0, 2.0, 2.0])
    fig = measure(
        "m",
        lambda: next(lake),
        lambda: next(ref),
        unit="x",
        goal=at_least(0.5, ">= 0.5"),
        pairs=3,
    )
    assert fig.pairs == 3
    assert (fig.ratio_q1, fig.ratio, fig.ratio_q3) == (0.75, 1.0, 1.25)
    assert fig.verdict == "met"
    assert fig.load_1m_min is not None
    assert fig.cpus >= 1


def test_json_lines_round_trip_and_report_rows(tmp_path: Path) -> None:
    figs = [
        figure("a", [1.0, 1.1], [1.0, 1.0], unit="MiB/s", goal=at_least(0.95, ">= 0.95")),
        figure("b", [1.0, 1.0], [2.0, 2.0], unit="x", goal=None),
    ]
    path = tmp_path / "run.jsonl"
    path.write_text("# a comment line\n" + "\n".join(f.json() for f in figs) + "\n")
    loaded = load_figures(path)
    assert loaded == figs
    line = json.loads(figs[0].json())
    for key in ("ratio", "ratio_q1", "ratio_q3", "pairs", "verdict", "load_1m_max", "cpus"):
        assert key in line
    page = render(loaded)
    assert "| `a` |" in page
    assert "| met |" in page
    assert "| `b` |" in page
    assert "| n/a |" in page
    assert "on " in page
    assert "CPUs" in page


def test_missed_and_unsettled_are_bold_in_the_report() -> None:
    base = figure("x", [1.0], [1.0], unit="x", goal=at_least(2.0, ">= 2"))
    assert base.verdict == "missed"
    assert result(base) == "**missed**"
    unsettled = Figure(**{**json.loads(base.json()), "verdict": "unsettled"})
    assert result(unsettled) == "**unsettled**"


def test_report_and_chart_survive_degenerate_ratios(tmp_path: Path) -> None:
    figs = [
        figure("zero_ref", [1.0, 2.0], [0.0, 0.0], unit="x", goal=at_least(1.0, ">= 1")),
        figure("zero_both", [0.0], [0.0], unit="x", goal=None),
        figure(
            "diff", [9.0, 8.0], [1.0, 1.0], unit="ms", goal=at_most(5.0, "+5", scale="difference")
        ),
    ]
    assert figs[0].ratio == math.inf
    assert figs[1].verdict == "n/a"
    assert figs[2].verdict == "missed"
    report, chart = tmp_path / "performance.md", tmp_path / "performance.png"
    write_report(figs, report, chart)
    assert chart.stat().st_size > 0
    page = report.read_text()
    assert "| `zero_ref` |" in page
    assert "Δ +7.5 [+7.25, +7.75] ms" in page
    assert load_summary(figs) == f"not recorded ({figs[0].cpus} CPUs)"


def test_load_summary_spans_every_figure() -> None:
    figs = [
        figure("a", [1.0], [1.0], unit="x", goal=None, load_1m=[0.5, 1.25]),
        figure("b", [1.0], [1.0], unit="x", goal=None, load_1m=[math.nan, 3.0]),
    ]
    assert (figs[1].load_1m_min, figs[1].load_1m_max) == (3.0, 3.0)
    summary = load_summary(figs)
    assert "between 0.5 and 3 " in summary
    assert summary.endswith(f"on {figs[0].cpus} CPUs")


def test_timed_threads_runs_every_target_at_once_and_raises_after_all_end() -> None:
    barrier = threading.Barrier(3, timeout=5)
    ended: list[int] = []

    def target(n: int) -> None:
        barrier.wait()  # passes only if all three run at the same time
        ended.append(n)

    assert timed_threads([lambda n=n: target(n) for n in range(3)]) >= 0
    assert sorted(ended) == [0, 1, 2]

    def fails() -> None:
        raise ValueError("first")

    slow_done: list[bool] = []

    def slow() -> None:
        time.sleep(0.05)
        slow_done.append(True)

    with pytest.raises(ValueError, match="first"):
        timed_threads([fails, slow])
    assert slow_done == [True]  # raised only once the other thread had ended
