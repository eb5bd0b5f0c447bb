"""Upload progress bars for terminals (rich); silent elsewhere.

``UploadProgressBar`` is a :data:`~lake_objects.ProgressCallback` that draws
one bar per upload on stderr when stderr is an interactive terminal and
``LAKE_NO_PROGRESS`` is unset, and does nothing otherwise (pipes, CI logs,
cron). Clients draw one by default (``progress=None``); ``progress=False``
turns bars off, and a callback of your own replaces them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lake_objects.progress import ProgressCallback, TaskBars, UploadProgress, progress_enabled

__all__ = ["UploadProgressBar", "upload_progress"]


class UploadProgressBar(TaskBars):
    """Use as ``with UploadProgressBar() as bar: await client.insert(..., progress=bar)``.

    ``force=True`` draws even off a terminal, ``force=False`` never draws.
    """

    def __init__(self, *, force: bool | None = None) -> None:
        super().__init__(enabled=force, unit="bytes")

    def __call__(self, update: UploadProgress) -> None:
        self.update(f"upload {update.name}", update.done, update.total, finished=update.finished)


@contextmanager
def upload_progress(
    *choices: ProgressCallback | bool | None,
) -> Iterator[ProgressCallback | None]:
    """The callback for one insert: the first of ``choices`` that is not None decides.

    A callback is used as given, ``False`` means none, ``True`` a bar even off
    a terminal; if every choice is None, a bar when :func:`progress_enabled`.
    """
    choice = next((c for c in choices if c is not None), None)
    if choice is False:
        yield None
    elif callable(choice):
        yield choice
    elif choice is True or progress_enabled():
        with UploadProgressBar(force=True) as bar:
            yield bar
    else:
        yield None
