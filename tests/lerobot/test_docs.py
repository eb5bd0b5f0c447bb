"""docs/lerobot.md runs as written, once, over a small v3.0 dataset in its working directory.

Once, not twice: the page's import creates its tables and its exports write
new directories, which a second pass would find taken (and must refuse).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lerobot.checker import check_dataset
from tools.lake_testing.docs import DocRun
from tools.lake_testing.lerobot import DatasetSpec, write_dataset

ROOT = Path(__file__).resolve().parents[2]


def test_lerobot_page_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "pick_place", DatasetSpec(lengths=(4, 3, 5, 2)))
    page = DocRun(ROOT / "docs" / "lerobot.md", tmp_path)
    names = page.run_pass()
    assert "2 episodes, 9 frames exported" in capsys.readouterr().out
    assert names["long_ones"].num_rows == 2  # type: ignore[attr-defined]
    assert len(check_dataset(tmp_path / "long_episodes")["episodes"]) == 2
    assert len(check_dataset(tmp_path / "short_episodes")["episodes"]) == 2
    assert not page.servers
