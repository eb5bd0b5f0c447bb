"""The upload progress bar: drawn when forced (or on a terminal), silent otherwise."""

from __future__ import annotations

import pytest

from lake_objects import UploadProgress
from lake_sdk import UploadProgressBar


def test_quiet_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with UploadProgressBar() as bar:
        assert not bar.enabled
        bar(UploadProgress("a.mp4", 10, 100))
        bar(UploadProgress("a.mp4", 100, 100, finished=True))
    assert capsys.readouterr().err == ""


def test_draws_when_forced() -> None:
    with UploadProgressBar(force=True) as bar:
        bar(UploadProgress("a.mp4", 10, 100))
        bar(UploadProgress("stream", 5, None))
        bar(UploadProgress("a.mp4", 100, 100, finished=True))
    assert bar.enabled
