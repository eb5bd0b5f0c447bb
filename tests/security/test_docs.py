"""docs/security.md's client examples run, twice, against the secured cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.security.cluster import ROWS, SecureCluster, private_file
from tools.lake_testing.dataplane import data_plane_streams
from tools.lake_testing.servers import LakeProcess

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


DATA_PLANE_DOC = DOC.parent / "dataplane.md"


def test_the_data_plane_pyarrow_example_runs(
    secure: SecureCluster,
    data_plane: LakeProcess,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/dataplane.md's pyarrow example follows the data plane's location, twice."""
    (block,) = re.findall(r"```python\n(.*?)```", DATA_PLANE_DOC.read_text(), re.S)
    token_file = private_file(tmp_path / "query-token", secure.tokens["alice"] + "\n")
    code = (
        block.replace("/run/secrets/query-token", str(token_file))
        .replace("/run/tls/ca.crt", str(secure.ca.cert_file))
        .replace("grpc+tls://query.internal:50051", f"grpc+tls://{data_plane.addr}")
        .replace("acme_episodes.runs", "acme_ops.runs")
    )
    before = data_plane_streams(data_plane)
    for _ in (1, 2):
        exec(compile(code, str(DATA_PLANE_DOC), "exec"), {})
        out = capsys.readouterr().out
        assert f"{ROWS} rows from [<pyarrow.flight.Location b'grpc+tls://127.0.0.1:" in out
    assert data_plane_streams(data_plane) - before == 2
