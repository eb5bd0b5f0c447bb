"""Every step of the README and the guides runs, twice in a row, as a reader would.

Each Python block runs as its own script (a fresh namespace), so every block
carries its own imports and setup.

Twice, because a reader runs a tutorial again: every step must be idempotent
(``--if-not-exists``, inserts that add a version, queries that hold for any
number of runs). Servers are started from the pages' own ``lake meta`` /
``lake query`` lines (see tools/lake_testing/docs.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.filetype import file_field
from lake_core.names import TableRef
from tools.lake_testing.data import create_table
from tools.lake_testing.docs import DocRun, blocks, shell_blocks
from tools.lake_testing.plugin import LakeCluster

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    # Both servers started at once, the next steps right after: as a reader pastes it.
    # Each Python block runs alone (DocRun's default): no name reaches it from another.
    page = DocRun(ROOT / "docs" / "quickstart.md", tmp_path, pasted_whole=True)
    for attempt in (1, 2):
        names = page.run_pass()
        assert names["version"] == attempt
        summary = names["summary"]
        assert isinstance(summary, pa.Table)
        assert summary.to_pylist() == [
            {"robot_id": "bb8", "episodes": attempt, "mean_reward": 0.5},
            {"robot_id": "r2d2", "episodes": 2 * attempt, "mean_reward": 0.5},
        ]
        out = capsys.readouterr().out
        assert f"committed version {attempt}" in out
        assert "262144 bytes; size and sha256 verified: True" in out
        assert "bytes of ep-" in out
    assert page.ran.count("kill %1 %2") == 2
    assert not page.servers


def test_readme_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    page = DocRun(ROOT / "README.md", tmp_path, pasted_whole=True)
    for _ in (1, 2):
        page.run_pass()
    assert any(c.startswith("lake sql") for c in page.ran)


def test_files_guide_runs_twice(
    lake_cluster: LakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pa.schema([pa.field("episode_id", pa.utf8()), file_field("video")])
    create_table(lake_cluster.meta.addr, TableRef("robots", "episodes"), schema)
    monkeypatch.chdir(tmp_path)
    code = [b.code for b in blocks(ROOT / "docs" / "files.md") if b.lang == "python"]
    assert code
    for _ in (1, 2):
        for block in code:
            block = block.replace("grpc://127.0.0.1:50051", lake_cluster.query.url)
            exec(compile(block, "docs/files.md", "exec"), {"__name__": "__main__"})
    with lake_sdk.Client(lake_cluster.query.url) as client:
        assert client.query_table("SELECT count(*) AS n FROM robots.episodes")["n"][0].as_py() == 4


def test_ingest_guide_runs_twice(
    lake_cluster: LakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code = [b.code for b in blocks(ROOT / "docs" / "ingest.md") if b.lang == "python"]
    assert len(code) == 2
    for _ in (1, 2):
        for block in code:
            block = block.replace("grpc://127.0.0.1:50051", lake_cluster.query.url)
            exec(compile(block, "docs/ingest.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.count("ingested 200000 rows") == 2
    # create_append made the table, then each ingest was one version.
    assert "ingested at version 2" in out
    assert "ingested at version 4" in out
    with lake_sdk.Client(lake_cluster.query.url) as client:
        n = client.query_table("SELECT count(*) AS n FROM robots.rewards")["n"][0].as_py()
    assert n == 500_000


def test_ingest_guide_blocks_run_alone(
    lake_cluster: LakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # Last block first, each in a fresh namespace: none leans on one before it.
    code = [b.code for b in blocks(ROOT / "docs" / "ingest.md") if b.lang == "python"]
    for block in reversed(code):
        block = block.replace("grpc://127.0.0.1:50051", lake_cluster.query.url)
        exec(compile(block, "docs/ingest.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "ingested at version 1" in out  # into the table the block created itself
    assert "ingested 200000 rows" in out


#: Pages whose Python runs in the tests of the feature they describe (twice), which
#: start the servers each needs (a secured cluster, a video, two replicas).
RUN_ELSEWHERE = {
    "security.md": "tests/security/test_docs.py",
    "dataplane.md": "tests/security/test_docs.py",
    "time-travel.md": "tests/timetravel/test_time_travel.py",
    "training.md": "tests/training/test_video.py",
    "async-queries.md": "tests/async_queries/test_docs.py",
}

#: Pages run whole, shell and Python blocks in order, by DocRun (twice), and the test.
RUN_WHOLE = {
    "README.md": "tests/docs/test_snippets.py",
    "quickstart.md": "tests/docs/test_snippets.py",
    "cloud.md": "tests/docs/test_shell_pages.py",
    "integrity.md": "tests/docs/test_shell_pages.py",
    "gc.md": "tests/docs/test_shell_pages.py",
    "iceberg.md": "tests/docs/test_iceberg_guide.py",
    "registrar.md": "tests/docs/test_iceberg_guide.py",
    "recordings.md": "tests/recordings/test_docs.py",
    "lerobot.md": "tests/lerobot/test_docs.py",
}

#: Pages with shell blocks no test runs, and why. A usage synopsis (``[--json]``,
#: ``NS.TABLE``) is ``text``, not shell: it is not a command a reader runs.
SHELL_NOT_RUN = {
    "performance.md": "`hatch run bench` is the benchmark suite itself (tests/bench runs its harness)",
    "security.md": "a deployment's command line over the operator's secret files; "
    "tests/security/cluster.py starts Query with the same variables",
    "training.md": "`pip install './packages/lake-sdk[video]'` only; tests/packaging installs the SDK",
    "console.md": "`lake console` serves until stopped; tests/console starts it with the same options",
}


def test_operations_snippet_runs_twice() -> None:
    # Each run in a fresh process: the snippet registers a series in the process registry.
    [code] = [b.code for b in blocks(ROOT / "docs" / "operations.md") if b.lang == "python"]
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr


def test_every_page_with_code_is_run() -> None:
    # A new page with Python or shell in it must join a test, or say here why it is not run.
    run_here = {"files.md", "ingest.md", "operations.md"}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    with_python = {p.name for p in pages if any(b.lang == "python" for b in blocks(p))}
    runs_python = run_here | set(RUN_ELSEWHERE) | set(RUN_WHOLE)
    assert with_python <= runs_python, with_python - runs_python
    with_shell = {p.name for p in pages if shell_blocks(p)}
    assert with_shell == set(RUN_WHOLE) | set(SHELL_NOT_RUN), with_shell ^ (
        set(RUN_WHOLE) | set(SHELL_NOT_RUN)
    )
    assert not set(RUN_WHOLE) & set(SHELL_NOT_RUN)
    for page, test in RUN_ELSEWHERE.items():
        assert page in (ROOT / test).read_text(), f"{test} does not run docs/{page}"
    for page, test in RUN_WHOLE.items():
        source = (ROOT / test).read_text()
        assert page in source, f"{test} does not run docs/{page}"
        assert "DocRun(" in source, f"{test} does not run docs/{page} through DocRun"
