"""The README's "Installing the SDK alone" command works in a clean venv, as written."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tools.lake_testing.docs import blocks, commands

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, sys
import pyarrow as pa
import lake_sdk
from lake_sdk import _frames as frames
assert importlib.util.find_spec("lake_metasrv") is None and importlib.util.find_spec("lake_query") is None
assert importlib.util.find_spec("pandas") is None, "pandas came without the [pandas] extra"
try:
    frames.to_pandas(pa.table({"a": [1]}))
except lake_sdk.MissingExtra as exc:
    print(exc)
assert importlib.util.find_spec("av") is None, "PyAV came without the [video] extra"
try:
    import lake_sdk.video
except lake_sdk.MissingExtra as exc:
    print(exc)
"""


def _readme_install() -> list[str]:
    for block in blocks(ROOT / "README.md"):
        for command in commands(block.code):
            if command.startswith("pip install ./packages/lake-core"):
                return shlex.split(command)[2:]
    raise AssertionError("README.md lost its SDK install command")


@pytest.mark.slow
def test_readme_path_install_gives_a_working_sdk(tmp_path: Path) -> None:
    args = _readme_install()
    assert args == ["./packages/lake-core", "./packages/lake-objects", "./packages/lake-sdk"]
    env_dir = tmp_path / "venv"
    uv = shutil.which("uv")
    venv.create(env_dir, with_pip=uv is None, clear=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    # uv resolves local paths exactly as pip does (and installs from its cache in seconds).
    installer = (
        [uv, "pip", "install", "--quiet", "--python", str(python)]
        if uv is not None
        else [str(python), "-m", "pip", "install", "--quiet"]
    )
    subprocess.run([*installer, *args], check=True, cwd=ROOT, env=clean_env, timeout=600)
    out = subprocess.run(
        [str(python), "-c", PROBE], check=True, capture_output=True, text=True, env=clean_env
    ).stdout
    assert "pip install 'pandas>=2.2' (the lake-sdk[pandas] extra" in out
    help_text = subprocess.run(
        [str(env_dir / "bin" / "lake"), "--help"],
        check=True,
        capture_output=True,
        text=True,
        env=clean_env,
    ).stdout
    for command in ("client", "demo", "sql", "console"):
        assert f"  {command} " in help_text
    # `lake console` without lake-sdk[console] names what installs it.
    console = subprocess.run(
        [str(env_dir / "bin" / "lake"), "console"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=120,
    )
    assert console.returncode != 0
    assert "(the lake-sdk[console] extra" in console.stdout + console.stderr
    # Every install hint names something that installs (Lake is on no index yet).
    assert "pip install 'av<19,>=18' (the lake-sdk[video] extra" in out
    demo = subprocess.run(
        [str(env_dir / "bin" / "lake"), "demo"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=120,
    )
    assert demo.returncode != 0
    assert "pip install ./packages/lake-metasrv ./packages/lake-query" in demo.stderr, demo.stderr
