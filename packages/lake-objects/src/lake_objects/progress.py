"""Upload progress: a plain callback, so any UI (or none) can show it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ProgressCallback", "ProgressTracker", "UploadProgress"]


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
