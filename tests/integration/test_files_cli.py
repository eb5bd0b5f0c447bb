"""``lake files put/get`` and ``lake table load`` against a real ``lake meta`` and ``lake query``.

Only Query's address is given (``--addr``); bytes go straight to the managed
stage. Good input round-trips exactly; bad input is a typed error that leaves
nothing behind (no OUT file, no table version).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import lake_sdk
from lake_core.cli import lake
from lake_core.config import NO_PROGRESS
from lake_core.errors import HashMismatch, InvalidArgument, TableNotFound
from lake_core.filetype import file_field, location_to_row
from lake_core.models import DataLocation
from tools.lake_testing.plugin import LakeCluster, cluster_env

LAKE = [sys.executable, "-c", "from lake_core.cli import main; main()"]
CLIPS = pa.schema([("clip_id", pa.int64()), file_field("video")])
RUNS = pa.schema([("run_id", pa.int64()), ("robot", pa.utf8()), ("score", pa.float64())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeCluster]:
    root = tmp_path_factory.mktemp("files-cli")
    lake_cluster = LakeCluster.start(root, cluster_env(root))
    try:
        with lake_sdk.Client(lake_cluster.query.url) as client:
            client.create_table("cli.clips", CLIPS)
            client.create_table("cli.runs", RUNS)
        yield lake_cluster
    finally:
        lake_cluster.stop()


def run(cluster: LakeCluster, *args: str) -> str:
    result = CliRunner().invoke(
        lake, [*args, "--addr", cluster.query.url], catch_exceptions=False, env={NO_PROGRESS: "1"}
    )
    assert result.exit_code == 0, result.output
    return result.output


def put(cluster: LakeCluster, path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(run(cluster, "files", "put", str(path), "-o", "json"))
    return document


def test_put_prints_the_location_and_get_downloads_it_verified(
    cluster: LakeCluster, tmp_path: Path
) -> None:
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"frame" * 50_000)
    location = put(cluster, clip)
    assert set(location) == {"uri", "media_type", "size_bytes", "sha256"}
    assert location["media_type"] == "video/mp4"
    assert location["size_bytes"] == clip.stat().st_size
    assert location["sha256"] == hashlib.sha256(clip.read_bytes()).hexdigest()
    out = tmp_path / "copy.mp4"
    run(cluster, "files", "get", json.dumps(location), str(out))
    assert out.read_bytes() == clip.read_bytes()
    # The same object through a FILE cell a statement selects, and to standard output.
    with lake_sdk.Client(cluster.query.url) as client:
        row = {"clip_id": 7, "video": location_to_row(DataLocation(**location))}
        client.append_batches("cli.clips", pa.Table.from_pylist([row], schema=CLIPS))
    selected = tmp_path / "selected.mp4"
    run(cluster, "files", "get", "SELECT video FROM cli.clips WHERE clip_id = 7", str(selected))
    assert selected.read_bytes() == clip.read_bytes()
    result = CliRunner().invoke(
        lake,
        ["files", "get", json.dumps(location), "-", "--addr", cluster.query.url],
        catch_exceptions=False,
        env={NO_PROGRESS: "1"},
    )
    assert result.stdout_bytes == clip.read_bytes()


def test_get_refuses_what_is_not_one_verified_object(cluster: LakeCluster, tmp_path: Path) -> None:
    clip = tmp_path / "clip.bin"
    clip.write_bytes(b"\x00\x01" * 1000)
    location = put(cluster, clip)
    out = tmp_path / "out.bin"
    runner = CliRunner(env={NO_PROGRESS: "1"})
    addr = ["--addr", cluster.query.url]
    tampered = {**location, "sha256": "0" * 64}
    with pytest.raises(HashMismatch):
        runner.invoke(
            lake, ["files", "get", json.dumps(tampered), str(out), *addr], catch_exceptions=False
        )
    with pytest.raises(InvalidArgument):
        runner.invoke(lake, ["files", "get", '{"uri": 1}', str(out), *addr], catch_exceptions=False)
    with pytest.raises(InvalidArgument):  # no FILE column
        runner.invoke(
            lake, ["files", "get", "SELECT 1 AS x", str(out), *addr], catch_exceptions=False
        )
    with pytest.raises(InvalidArgument):  # no row
        runner.invoke(
            lake,
            ["files", "get", "SELECT video FROM cli.clips WHERE clip_id < 0", str(out), *addr],
            catch_exceptions=False,
        )
    assert list(tmp_path.iterdir()) == [clip]  # nothing written, no partial file left


def test_get_refuses_an_out_it_cannot_write_on_one_line(
    cluster: LakeCluster, tmp_path: Path
) -> None:
    """An OUT in a missing or read-only directory, or naming no file: one line, no traceback."""
    clip = tmp_path / "clip.bin"
    clip.write_bytes(b"\x02" * 100)
    location = json.dumps(put(cluster, clip))
    for out, expected in [
        (str(tmp_path / "missing" / "o"), "does not exist"),
        ("", "names no file"),
        ("/proc/o", "Could not open file"),
    ]:
        result = subprocess.run(
            [*LAKE, "files", "get", location, out, "--addr", cluster.query.url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode in (1, 2), result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert expected in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == [clip]


def test_a_failed_command_prints_one_line(cluster: LakeCluster, tmp_path: Path) -> None:
    out = subprocess.run(
        [*LAKE, "files", "get", '{"uri": 1}', str(tmp_path / "o"), "--addr", cluster.query.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: not a DataLocation"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def runs(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {"run_id": ids, "robot": [f"r{i % 3}" for i in ids], "score": [i / 2 for i in ids]},
        schema=RUNS,
    )


def count(cluster: LakeCluster) -> tuple[int, int]:
    with lake_sdk.Client(cluster.query.url) as client:
        rows = client.query_table("SELECT count(*) AS n FROM cli.runs").column("n")[0].as_py()
        return rows, client.describe_table("cli.runs").version


def test_table_load_appends_a_file_as_one_version(cluster: LakeCluster, tmp_path: Path) -> None:
    rows_before, version = count(cluster)
    parquet = tmp_path / "runs.parquet"
    # Columns in another order and strings in polars' large_string: matched and cast.
    data = runs(0, 25_000)
    pq.write_table(
        data.select(["score", "run_id", "robot"]).cast(
            pa.schema([("score", pa.float64()), ("run_id", pa.int64()), ("robot", pa.large_utf8())])
        ),
        parquet,
        row_group_size=4096,
    )
    loaded = json.loads(run(cluster, "table", "load", "cli.runs", str(parquet), "-o", "json"))
    assert loaded == {"table": "cli.runs", "version": version + 1, "rows": 25_000}
    csv = tmp_path / "runs.csv"
    csv.write_text("run_id,robot,score\n" + "".join(f"{i},r{i},{i}.5\n" for i in range(10)))
    text = run(cluster, "table", "load", "cli.runs", str(csv))
    assert text.strip() == f"loaded 10 rows into cli.runs at version {version + 2}"
    assert count(cluster) == (rows_before + 25_010, version + 2)


def test_table_load_refuses_a_file_that_does_not_fit(cluster: LakeCluster, tmp_path: Path) -> None:
    before = count(cluster)
    runner = CliRunner(env={NO_PROGRESS: "1"})
    addr = ["--addr", cluster.query.url]
    extra = tmp_path / "extra.csv"
    extra.write_text("run_id,robot,score,notes\n1,r,1.0,x\n")
    wrong = tmp_path / "wrong.csv"
    # A value that does not parse, far into the file: nothing of the file commits.
    wrong.write_text(
        "run_id,robot,score\n" + "".join(f"{i},r,1.0\n" for i in range(50_000)) + "oops,r,1.0\n"
    )
    other = tmp_path / "runs.json"
    other.write_text("[]")
    for path in (extra, wrong, other):
        with pytest.raises(InvalidArgument):
            runner.invoke(
                lake, ["table", "load", "cli.runs", str(path), *addr], catch_exceptions=False
            )
    with pytest.raises(TableNotFound):
        runner.invoke(
            lake, ["table", "load", "cli.nothing", str(extra), *addr], catch_exceptions=False
        )
    assert count(cluster) == before
