"""``hatch run bench [--quick] [--only NAME]``: every benchmark, one JSON line per figure.

Figures go to stdout as JSON lines (``hatch run bench | tee run.jsonl`` keeps
them; ``python -m tools.bench.report run.jsonl`` renders them); progress and
the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

from tools.bench.harness import Figure, machine
from tools.bench.report import CHART, REPORT, write_report

BENCHMARKS = [
    "tools.bench.query_bench",
    "tools.bench.commit_bench",
    "tools.bench.admission_bench",
    "tools.bench.guards_bench",
    "tools.bench.overflow_bench",
    "tools.bench.objects_bench",
    "tools.bench.dynamo_bench",
    "tools.bench.registrar_bench",
    "tools.bench.verify_bench",
    "tools.bench.verify_cost_bench",
    "tools.bench.partitions_bench",
    "tools.bench.gc_bench",
    "tools.bench.frames_bench",
    "tools.bench.iceberg_bench",
    "tools.bench.telemetry_bench",
    "tools.bench.async_bench",
    "tools.bench.ray_bench",
    "tools.bench.visibility_bench",
    "tools.bench.fleet_bench",
    "tools.bench.small_files_bench",
    "tools.bench.recordings_bench",
    "tools.bench.lerobot_bench",
    "tools.bench.ingest_bench",
    "tools.bench.console_bench",
]


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--quick", action="store_true", help="small data: a smoke run")
    parser.add_argument("--only", action="append", default=[], help="module suffix to run")
    parser.add_argument(
        "--report",
        action="store_true",
        help="rewrite docs/performance.md and its chart (default for a full run of everything)",
    )
    args = parser.parse_args()
    print(f"# {machine()}, load average {_load()} at start", file=sys.stderr, flush=True)
    failed = False
    figures: list[Figure] = []
    for name in BENCHMARKS:
        if args.only and not any(name.endswith(o) for o in args.only):
            continue
        began = time.perf_counter()
        try:
            module = importlib.import_module(name)
            for figure in module.run(args.quick):
                print(figure.json(), flush=True)
                figures.append(figure)
        except Exception:
            traceback.print_exc()
            failed = True
        print(f"# {name}: {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    print(f"# load average {_load()} at the end", file=sys.stderr, flush=True)
    if figures and (args.report or not (args.quick or args.only)):
        if failed:
            # A page with figures missing would read as a complete run.
            print(f"a benchmark failed: {REPORT} left as it was", file=sys.stderr)
        else:
            write_report(figures)
            print(f"wrote {REPORT} and {CHART}", file=sys.stderr)
    return 1 if failed else 0


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


if __name__ == "__main__":
    sys.exit(main())
