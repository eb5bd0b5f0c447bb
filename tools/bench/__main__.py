"""``hatch run bench [--quick] [--only NAME]``: every benchmark, one JSON line per figure."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from tools.bench.harness import Figure
from tools.bench.report import CHART, REPORT, write_report

BENCHMARKS = [
    "tools.bench.query_bench",
    "tools.bench.commit_bench",
    "tools.bench.admission_bench",
    "tools.bench.objects_bench",
    "tools.bench.dynamo_bench",
    "tools.bench.verify_bench",
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
    failed = False
    figures: list[Figure] = []
    for name in BENCHMARKS:
        if args.only and not any(name.endswith(o) for o in args.only):
            continue
        try:
            module = importlib.import_module(name)
            for figure in module.run(args.quick):
                print(figure.json(), flush=True)
                figures.append(figure)
        except Exception:
            traceback.print_exc()
            failed = True
    if figures and (args.report or not (args.quick or args.only)):
        write_report(figures)
        print(f"wrote {REPORT} and {CHART}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
