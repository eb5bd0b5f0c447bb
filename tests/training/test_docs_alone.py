"""docs/training.md makes its own sample data, and each of its Python blocks runs alone.

Against a fresh ``lake meta`` and ``lake query`` with nothing in them: the
page's "Sample data" script creates the tables, the zip bundle and the video
through Query, then the reading and video examples run, each as its own script
(a fresh namespace), twice, as a reader reruns a page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lake_sdk
from tools.lake_testing.plugin import LakeCluster

PAGE = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _section(heading: str) -> list[str]:
    body = PAGE.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_the_page_makes_its_data_and_each_block_runs_alone(
    lake_cluster: LakeCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    [setup] = _section("Sample data")
    examples = _section("Reading files") + _section("Video frames")
    assert len(examples) == 2
    for _ in (1, 2):
        for block in [setup, *examples]:
            code = block.replace("grpc://127.0.0.1:50051", lake_cluster.query.url)
            exec(compile(code, "docs/training.md", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    assert printed.count("of the video fetched") == 2
    assert "training.samples at version 1" in printed
    with lake_sdk.Client(lake_cluster.query.url) as client:
        assert client.describe_table("training.samples").version == 2
        episodes = client.query_table("SELECT episode_id FROM robots.episodes")
    assert episodes.column("episode_id").to_pylist() == ["ep-7", "ep-7"]
