"""docs/security.md's SDK example runs against the secured cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.security.cluster import SecureCluster, private_file

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_the_sdk_builder_example_runs(
    secure: SecureCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    block = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[0]
    token_file = private_file(tmp_path / "query-token", secure.tokens["alice"] + "\n")
    code = (
        block.replace("/run/secrets/query-token", str(token_file))
        .replace("/run/tls/ca.crt", str(secure.ca.cert_file))
        .replace("https://query.internal:50051", f"https://{secure.query.addr}")
        .replace('"query.internal"', '"lake-query.test"')
        .replace("acme_episodes.runs", "acme_ops.runs")
    )
    exec(compile(code, str(DOC), "exec"), {})
    assert "count(*)" in capsys.readouterr().out
