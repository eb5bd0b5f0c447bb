"""The documentation's examples run, against real processes where they need them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core.names import TableRef
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


@pytest.mark.parametrize("package", ["lake-core", "lake-objects", "lake-gc", "lake-iceberg"])
def test_standalone_readme_examples(package: str) -> None:
    blocks = python_blocks(ROOT / "packages" / package / "README.md")
    assert blocks, f"{package}/README.md has no runnable example"
    for _ in (1, 2):  # twice: a reader runs an example again
        for block in blocks:
            exec(compile(block, f"{package}/README.md", "exec"), {})


def _episodes_table(cluster: LakeCluster) -> None:
    schema = pa.schema(
        [("episode_id", pa.utf8()), ("reward", pa.float64()), ("robot_id", pa.utf8())]
    )
    create_table(cluster.meta.addr, TableRef("robots", "episodes"), schema)


def test_sdk_readme_example(lake_cluster: LakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    schema = pa.schema([("episode_id", pa.utf8()), ("reward", pa.float64())])
    create_table(lake_cluster.meta.addr, TableRef("robots", "episodes"), schema)
    for _ in (1, 2):  # twice: a reader runs an example again
        for block in python_blocks(ROOT / "packages" / "lake-sdk" / "README.md"):
            code = block.replace("grpc://127.0.0.1:50051", lake_cluster.query.url)
            exec(compile(code, "lake-sdk/README.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "committed version 1" in out
    assert "committed version 2" in out


def test_root_readme_adbc_example(
    lake_cluster: LakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    _episodes_table(lake_cluster)
    blocks = python_blocks(ROOT / "README.md")
    assert blocks
    for block in blocks:
        exec(
            compile(
                block.replace("grpc://127.0.0.1:50051", lake_cluster.query.url), "README.md", "exec"
            ),
            {},
        )
    assert "robot_id" in capsys.readouterr().out


@pytest.mark.slow
def test_lake_demo_runs_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lake_core.cli import main; main()",
            "demo",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert "created table lake.robots.episodes at version 0" in out
    assert "committed version 3" in out
    assert "pinned result: 12 rows" in out
    assert "a new query:   16 rows" in out
    assert "Lake SQL is read-only" in out
    assert "sha256 verified" in out
    # The test environment has lake-sdk[mcap]: the demo adds a recording and reads 1 s of it.
    assert "added recording run-0001.mcap to lake.robots.recordings" in out
    assert "read 1 s of /pose in place: 50 messages" in out
    assert "imported LeRobot dataset pick_place: 4 episodes, 14 frames, 4 MP4s uploaded" in out
    assert "exported 2 episodes (9 frames) as a LeRobot v3.0 dataset" in out
    assert "stopped Query and Metasrv" in out


def _managed_files(cluster: LakeCluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "managed_files.py"),
            "--query",
            cluster.query.url,
            "--meta",
            cluster.meta.addr,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_managed_files_example(lake_cluster: LakeCluster) -> None:
    done = _managed_files(lake_cluster)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "inserted 2 clips at version 1" in done.stdout
    assert done.stdout.count("verified=True") == 2
    # Again, as it is: the table exists (TableExists, caught by its class) and a version is added.
    again = _managed_files(lake_cluster)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "inserted 2 clips at version 2" in again.stdout
    assert again.stdout.count("verified=True") == 2


def test_every_example_is_run() -> None:
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == ["managed_files.py"]
