"""Progress bars: drawn on a real terminal by default, silent elsewhere or when asked."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

import pytest

from lake_core.config import NO_PROGRESS
from lake_objects import UploadProgress
from lake_objects.progress import progress_enabled
from lake_sdk import UploadProgressBar
from lake_sdk._progress import upload_progress


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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_rule_terminal_env_and_explicit_choice() -> None:
    assert progress_enabled(stream=_Terminal(), env={})
    assert not progress_enabled(stream=io.StringIO(), env={})
    assert not progress_enabled(stream=_Terminal(), env={NO_PROGRESS: "1"})
    assert progress_enabled(stream=_Terminal(), env={NO_PROGRESS: ""})  # empty means unset
    assert not progress_enabled(False, stream=_Terminal(), env={})
    assert progress_enabled(True, stream=io.StringIO(), env={NO_PROGRESS: "1"})


BAR = """
import logging, sys
from lake_objects import UploadProgress
from lake_sdk import UploadProgressBar
from lake_sdk._progress import upload_progress
assert logging.getLogger().getEffectiveLevel() == logging.WARNING  # the default level
with UploadProgressBar() as bar:
    bar(UploadProgress("front.mp4", 50, 100))
    bar(UploadProgress("front.mp4", 100, 100, finished=True))
print("enabled" if bar.enabled else "disabled")
"""


def _on_a_terminal(env: dict[str, str]) -> tuple[str, str]:
    """Run BAR with stderr on a real pseudo-terminal (``env`` over ours, without
    LAKE_NO_PROGRESS); its stdout and what the terminal received."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", BAR],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=60,
            env={**{k: v for k, v in os.environ.items() if k != NO_PROGRESS}, **env},
        )
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0
    return done.stdout.strip(), b"".join(chunks).decode(errors="replace")


def test_a_real_terminal_gets_a_bar_at_the_default_log_level() -> None:
    state, terminal = _on_a_terminal({})
    assert state == "enabled"
    assert "upload front.mp4" in terminal


def test_lake_no_progress_silences_the_terminal() -> None:
    state, terminal = _on_a_terminal({NO_PROGRESS: "1"})
    assert state == "disabled"
    assert terminal == ""


def test_an_insert_picks_its_bar_call_first_then_client() -> None:
    def mine(update: UploadProgress) -> None: ...

    with upload_progress(None, None) as chosen:
        assert chosen is None  # pytest's stderr is not a terminal
    with upload_progress(False, mine) as chosen:
        assert chosen is None  # progress=False on the call wins over the client's callback
    with upload_progress(None, mine) as chosen:
        assert chosen is mine
    with upload_progress(mine, False) as chosen:
        assert chosen is mine
    with upload_progress(True, None) as chosen:
        assert isinstance(chosen, UploadProgressBar)
        assert chosen.enabled
