"""The README's Python example runs, against a real ``lake meta`` process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.lake_testing.servers import start_meta

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_starts_with_pip_install() -> None:
    # From a checkout, with its Lake dependencies in one pip command (no package index yet).
    install = "pip install ./packages/lake-core ./packages/lake-objects ./packages/lake-metasrv"
    text = README.read_text()
    assert text.startswith(f"# lake-metasrv\n\n```bash\n{install}\n```")


@pytest.mark.slow
def test_readme_python_example(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1
    meta = start_meta(tmp_path / "data", tmp_path)
    try:
        script = blocks[0].replace("127.0.0.1:50052", meta.addr)
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ),
        )
    finally:
        meta.stop()
    assert proc.returncode == 0, proc.stderr
    assert "created at version 0" in proc.stdout
    assert "committed version 1" in proc.stdout
