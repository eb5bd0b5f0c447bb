"""Progress: a plain upload callback, and the one rule and bar for drawing it.

Uploads report :class:`UploadProgress` to any callback, so any UI (or none)
can show it. :func:`progress_enabled` is the rule every Lake progress bar
follows (on on an interactive terminal, off elsewhere, ``progress=False`` or
``LAKE_NO_PROGRESS=1``), and :class:`TaskBars` the bar itself (rich, on stderr):
uploads, ``lake table verify`` and GC share both.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TextIO

from lake_core.config import NO_PROGRESS

__all__ = [
    "ProgressCallback",
    "ProgressTracker",
    "TaskBars",
    "UploadProgress",
    "progress_enabled",
]


@dataclass(frozen=True)
class UploadProgress:
    """Bytes of one upload sent (and hashed) so far; ``total`` is None for streams."""

    name: str
    done: int
    total: int | None
    finished: bool = False


ProgressCallback = Callable[[UploadProgress], None]


class ProgressTracker:
    """Counts one upload's bytes and reports them to an optional callback."""

    def __init__(self, name: str, total: int | None, callback: ProgressCallback | None) -> None:
        self.name = name
        self.total = total
        self.done = 0
        self._callback = callback

    def add(self, count: int) -> None:
        self.done += count
        if self._callback is not None:
            self._callback(UploadProgress(self.name, self.done, self.total))

    def finish(self) -> None:
        if self._callback is not None:
            self._callback(UploadProgress(self.name, self.done, self.total, finished=True))


def progress_enabled(
    progress: bool | None = None,
    *,
    stream: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> bool:
    """Whether to draw progress bars, by Hugging Face's and LanceDB's rule.

    ``progress=True`` or ``False`` decides. Otherwise bars are on exactly when
    ``stream`` (stderr) is an interactive terminal and ``LAKE_NO_PROGRESS`` is
    unset or empty: off in pipes, CI logs and cron. The log level plays no
    part (Python's root logger defaults to WARNING).
    """
    if progress is not None:
        return progress
    if (os.environ if env is None else env).get(NO_PROGRESS, ""):
        return False
    out = sys.stderr if stream is None else stream
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


class TaskBars:
    """Rich progress bars on stderr, one per named task; inert when disabled.

    The one bar implementation for uploads, verify and GC: use it as a
    context manager and call :meth:`update` (from the thread that owns it).
    ``unit="bytes"`` shows sizes and speed, ``"items"`` counts (files, objects).
    """

    def __init__(
        self, *, enabled: bool | None = None, unit: Literal["bytes", "items"] = "bytes"
    ) -> None:
        self.enabled = progress_enabled(enabled)
        self._unit = unit
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Self:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            columns: list[Any] = [TextColumn("{task.description}"), BarColumn()]
            if self._unit == "bytes":
                columns += [DownloadColumn(), TransferSpeedColumn()]
            else:
                columns.append(MofNCompleteColumn())
            self._progress = Progress(*columns, console=Console(stderr=True), transient=False)
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(self, name: str, done: int, total: int | None, *, finished: bool = False) -> None:
        """Move task ``name`` to ``done`` of ``total`` (None: unknown, e.g. a stream)."""
        if self._progress is None:
            return
        task = self._tasks.get(name)
        if task is None:
            task = self._progress.add_task(name, total=total)
            self._tasks[name] = task
        self._progress.update(task, completed=done, total=total if total is not None else done)
        if finished:
            self._tasks.pop(name, None)
