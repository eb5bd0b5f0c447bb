"""External sort with bounded memory: sorted, de-duplicated text lines.

Lines are collected into runs of at most ``run_lines``; each full run is
sorted and written to a temporary file, and :meth:`ExternalSorter.merged`
streams the k-way merge of the runs (merging in rounds of at most
:data:`FAN_IN` files, so open files stay bounded too). Memory is one run
plus one buffered line per open run, however many lines go in.

Lines must not contain control characters (callers validate): then sorting
``"<uri>\\t<fields>"`` lines sorts them by URI, since ``\\t`` sorts before
every character a URI may hold.
"""

from __future__ import annotations

import heapq
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = ["FAN_IN", "RUN_LINES", "ExternalSorter"]

#: Lines held in memory before a run is written out (~100 bytes each).
RUN_LINES = 50_000
#: Runs merged at once.
FAN_IN = 64
_BUFFER = 64 * 1024


class ExternalSorter:
    """Add lines in any order, then read them back sorted and without repeats."""

    def __init__(self, directory: Path, *, run_lines: int = RUN_LINES) -> None:
        self._directory = directory
        self._run_lines = run_lines
        self._lines: list[str] = []
        self._runs: list[Path] = []
        self.added = 0

    def add(self, line: str) -> None:
        self._lines.append(line)
        self.added += 1
        if len(self._lines) >= self._run_lines:
            self._spill()

    def add_all(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.add(line)

    def _spill(self) -> None:
        if not self._lines:
            return
        self._lines.sort()
        self._runs.append(self._write(_unique(iter(self._lines))))
        self._lines = []

    def _write(self, lines: Iterator[str]) -> Path:
        fd, name = tempfile.mkstemp(prefix="run-", suffix=".txt", dir=self._directory)
        with os.fdopen(fd, "w", encoding="utf-8", buffering=_BUFFER) as out:
            for line in lines:
                out.write(line)
                out.write("\n")
        return Path(name)

    def merged(self) -> Iterator[str]:
        """Every distinct line added, in sorted order (consumes the sorter)."""
        if not self._runs:
            self._lines.sort()
            lines, self._lines = self._lines, []
            yield from _unique(iter(lines))
            return
        self._spill()
        runs = self._runs
        while len(runs) > FAN_IN:
            runs = [self._write(_merge(runs[i : i + FAN_IN])) for i in range(0, len(runs), FAN_IN)]
        self._runs = runs
        try:
            yield from _merge(runs)
        finally:
            self.close()

    def close(self) -> None:
        for run in self._runs:
            run.unlink(missing_ok=True)
        self._runs = []
        self._lines = []


def _read(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", buffering=_BUFFER) as lines:
        for line in lines:
            yield line[:-1]


def _merge(runs: list[Path]) -> Iterator[str]:
    merged = _unique(heapq.merge(*(_read(r) for r in runs)))
    try:
        yield from merged
    finally:
        for run in runs:
            run.unlink(missing_ok=True)


def _unique(lines: Iterator[str]) -> Iterator[str]:
    previous: str | None = None
    for line in lines:
        if line != previous:
            yield line
            previous = line
