"""Upload progress bars for terminals (rich); silent elsewhere.

``UploadProgressBar`` is a :data:`~lake_objects.ProgressCallback` that draws
one bar per upload on stderr when stderr is a terminal and logging is at
INFO or below, and does nothing otherwise (pipes, CI logs, cron).
"""

from __future__ import annotations

import logging
import sys
from types import TracebackType
from typing import Any

from lake_objects.progress import UploadProgress

__all__ = ["UploadProgressBar"]


class UploadProgressBar:
    """Use as ``with UploadProgressBar() as bar: await client.insert(..., progress=bar)``."""

    def __init__(self, *, force: bool | None = None) -> None:
        interactive = (
            sys.stderr.isatty() and logging.getLogger().getEffectiveLevel() <= logging.INFO
        )
        self.enabled = interactive if force is None else force
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> UploadProgressBar:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                transient=False,
            )
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

    def __call__(self, update: UploadProgress) -> None:
        if self._progress is None:
            return
        task = self._tasks.get(update.name)
        if task is None:
            task = self._progress.add_task(f"upload {update.name}", total=update.total)
            self._tasks[update.name] = task
        self._progress.update(task, completed=update.done, total=update.total or update.done)
        if update.finished:
            self._tasks.pop(update.name, None)
