"""Upload progress: a plain callback, so any UI (or none) can show it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ProgressCallback", "UploadProgress"]


@dataclass(frozen=True)
class UploadProgress:
    """Bytes of one upload sent (and hashed) so far; ``total`` is None for streams."""

    name: str
    done: int
    total: int | None
    finished: bool = False


ProgressCallback = Callable[[UploadProgress], None]
