"""docs/recordings.md runs as written, twice: servers, a recording, the CLI, a window."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.lake_testing.docs import DocRun

ROOT = Path(__file__).resolve().parents[2]


def test_recordings_page_runs_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    page = DocRun(ROOT / "docs" / "recordings.md", tmp_path)
    for _ in (1, 2):
        names = page.run_pass()
        second = names["second"]
        assert isinstance(second, list)
        assert len(second) == 50
        assert second[0] == (1_793_491_200_000_000_000 + 2_000_000_000, 1.0)
        out = capsys.readouterr().out
        assert "500 messages; the summary cost" in out
        summary_bytes = names["summary_bytes"]
        assert isinstance(summary_bytes, int)
        assert summary_bytes <= 64 * 1024
    assert not page.servers
