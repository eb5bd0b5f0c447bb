"""docs/security.md's client examples run, twice, against the secured cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.security.cluster import SecureCluster, private_file

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_the_sdk_builder_example_runs(
    secure: SecureCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    token_file = private_file(tmp_path / "query-token", secure.tokens["alice"] + "\n")

    def runnable(block: str) -> str:
        return (
            block.replace("/run/secrets/query-token", str(token_file))
            .replace("/run/tls/ca.crt", str(secure.ca.cert_file))
            .replace("https://query.internal:50051", f"https://{secure.query.addr}")
            .replace("grpc+tls://query.internal:50051", f"grpc+tls://{secure.query.addr}")
            .replace('"query.internal"', '"lake-query.test"')
            .replace("acme_episodes.runs", "acme_ops.runs")
        )

    exec(compile(runnable(blocks[0]), str(DOC), "exec"), {})
    assert "count(*)" in capsys.readouterr().out
    # Every client snippet on the page (SDK, ADBC, pyarrow), twice in a row.
    assert len(blocks) == 3
    for _ in (1, 2):
        for block in blocks:
            exec(compile(runnable(block), str(DOC), "exec"), {})
        out = capsys.readouterr().out
        assert out.count("pyarrow.Table") == 2  # the SDK and ADBC results
        assert "lake.table_schema" in out
