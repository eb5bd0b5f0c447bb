"""``lake demo --data-dir`` refuses what cannot be its data directory, on one line.

An empty value used to resolve to the current directory and fill it with a
whole Lake data directory; a file or an uncreatable path was a traceback.
Each is now a usage error (exit 2) before any server starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LAKE = [sys.executable, "-c", "from lake_core.cli import main; main()"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "must name a directory"),
        ("a-file", "is a file"),
        ("/proc/lake-demo/x", "cannot create"),
    ],
)
def test_a_data_dir_that_cannot_be_one_is_a_usage_error(
    tmp_path: Path, value: str, expected: str
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    result = subprocess.run(
        [*LAKE, "demo", "--data-dir", value],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert expected in result.stderr, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]  # nothing spread over cwd
