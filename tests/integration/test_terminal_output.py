"""What a person at a terminal sees: readable server logs, one-line credential errors.

A real ``lake meta`` whose stderr is a pseudo-terminal logs console lines; with
``--log-format json`` (or with stderr redirected, as every other test runs it)
JSON records. ``lake segments ship`` with no AWS credentials anywhere prints
one typed line and exits 2 instead of botocore's traceback.
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tools.lake_testing.servers import free_port

LAKE = [sys.executable, "-c", "from lake_core.cli import main; main()"]
#: Environment without any log-format choice or AWS credential source.
CLEAN = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("LAKE_LOG", "AWS_")) and k not in ("NO_COLOR", "FORCE_COLOR")
}


def _meta_on_a_terminal(tmp_path: Path, *extra: str) -> list[str]:
    """The lines ``lake meta`` writes to a terminal up to its readiness banner."""
    master, slave = pty.openpty()
    args = ["meta", "--addr", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d")]
    process = subprocess.Popen(
        [*LAKE, *args, *extra],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=CLEAN,
    )
    os.close(slave)
    text = b""
    try:
        deadline = time.monotonic() + 120
        while b"listening on" not in text and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    text += os.read(master, 65536)
                except OSError:  # the process closed the terminal
                    break
            elif process.poll() is not None:
                break
    finally:
        process.terminate()
        process.wait(timeout=60)
        os.close(master)
    lines = text.decode(errors="replace").replace("\r\n", "\n").splitlines()
    assert any("listening on" in line for line in lines), text
    return [line for line in lines if line.strip()]


def test_a_server_on_a_terminal_logs_readable_lines(tmp_path: Path) -> None:
    lines = _meta_on_a_terminal(tmp_path)
    records = [line for line in lines if "listening on" not in line]
    assert records, lines
    assert not any(line.lstrip().startswith("{") for line in records), lines
    assert any("[info" in line for line in records), lines


def test_log_format_json_keeps_json_on_a_terminal(tmp_path: Path) -> None:
    lines = _meta_on_a_terminal(tmp_path, "--log-format", "json")
    for line in lines:
        json.loads(line)  # every line, the banner included, is one JSON record


def test_a_missing_aws_credential_is_one_line(tmp_path: Path) -> None:
    segment = tmp_path / "segments" / "runs" / "seg-0001.parquet"
    segment.parent.mkdir(parents=True)
    pq.write_table(pa.table({"a": [1]}), segment)
    env = {
        **CLEAN,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    done = subprocess.run(
        [
            *LAKE,
            "segments",
            "ship",
            str(tmp_path / "segments"),
            "--to",
            "s3://bucket/prefix",
            "--pipeline",
            "p",
            "--endpoint",
            f"http://127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: no AWS credentials found (NoCredentialsError): set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where a workload identity provides them"
    ], done.stderr


@pytest.mark.parametrize("name", ["NoCredentialsError", "PartialCredentialsError"])
def test_credential_errors_are_recognized_by_class(name: str) -> None:
    import botocore.exceptions

    from lake_core.credentials import credential_error
    from lake_core.errors import ConfigError

    kind = getattr(botocore.exceptions, name)
    error = kind() if name == "NoCredentialsError" else kind(provider="env", cred_var="x")
    assert isinstance(credential_error(error), ConfigError)
    assert credential_error(ValueError("Unable to locate credentials")) is None
