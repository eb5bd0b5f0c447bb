"""The performance report: ``docs/performance.md`` and its chart, from one run's figures."""

from __future__ import annotations

import json
from pathlib import Path

from tools.bench.harness import Figure, machine

__all__ = ["load_figures", "write_report"]

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "performance.md"
CHART = ROOT / "docs" / "performance.png"


def load_figures(path: Path) -> list[Figure]:
    return [Figure(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def _chart(figures: list[Figure], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f.name for f in figures]
    # A log axis cannot show zero or negative ratios (differences can be): clamp for drawing.
    ratios = [max(f.ratio, 0.01) for f in figures]
    colors = ["#2e7d32" if f.met else "#c62828" for f in figures]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(figures) + 1.5))
    y = range(len(figures))
    ax.barh(list(y), ratios, color=colors)
    for i, f in enumerate(figures):
        if f.threshold is not None:
            ax.plot([f.threshold, f.threshold], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.text(max(f.ratio, 0.01), i, f"  {f.ratio:g}", va="center", fontsize=8)
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio of Lake to its reference (log scale); black mark = goal")
    ax.set_title("Lake vs reference, one run (green: goal met, red: missed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(figures: list[Figure], report: Path = REPORT, chart: Path = CHART) -> None:
    _chart(figures, chart)
    rows = "\n".join(
        f"| `{f.name}` | {f.lake:g} | {f.reference:g} | {f.unit} | {f.ratio:g} | {f.goal} | "
        f"{'met' if f.met else '**missed**'} | {f.runs} |"
        for f in figures
    )
    report.write_text(
        f"""# Performance

Every figure is Lake against a reference measured in the same run on the same
machine, alternating the two run by run after a warm-up, and reporting the
median of each side. Ratios are what to read: absolute numbers on a shared
2-core machine drift from one run to the next.

Machine: {machine()}.

| figure | Lake | reference | unit | ratio | goal | result | runs |
|---|---|---|---|---|---|---|---|
{rows}

![ratios against their goals](performance.png)

What each missed figure costs and why, and how the figures moved as the
slow paths were fixed: [performance-analysis.md](performance-analysis.md).

## Reproduce

```
hatch run bench            # every benchmark, full sizes; rewrites this page and its chart
hatch run bench --quick    # small sizes, a smoke run (CI runs it; it fails only on a crash)
hatch run bench --only objects_bench
```

Each benchmark module in `tools/bench` starts the real servers it needs
(Metasrv, Query, SeaweedFS, dynalite) on loopback and stops them by pid.

## References

- DoGet: pyarrow's C++ Flight server in another process serving the same rows from memory.
- GROUP BY, point queries: the same SQL in in-process DataFusion on the same Lance version.
- Random access: `LanceDataset.take` in-process.
- Commits: an in-process SQLite compare-and-swap loop (WAL, synchronous=FULL).
- Uploads and ranged reads: raw aioboto3 against the same SeaweedFS, same part size and concurrency.
- Verified open: hashlib SHA-256 over the same file in 1 MiB chunks.
- Admission: the same workload with 2 clients instead of 16.
"""
    )
