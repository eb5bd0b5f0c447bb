"""A flipped byte in a table data file is found, and never served with verification on.

One byte of the table's data file is flipped at each of 32 positions in turn
(seeded, first and last byte included). Each time:

- Metasrv's verify (the ``lake client verify-table`` action) reports that file;
- a replica with ``LAKE_QUERY_VERIFY_ON_OPEN=true`` that has not verified the
  file (it never matched, so every open checks it again) fails the query
  with DATA_LOSS (:class:`DataCorrupted`) naming table and version, never a
  path, URI or panic text.

The CLI forms are run too: remote (``lake client --addr``) while serving, local
(``lake table verify --data-dir``) once Metasrv has stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.errors import DataCorrupted
from lake_core.integrity import VERIFY_TABLE, VerifyTableRequest, VerifyTableResult
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tools.lake_testing.data import create_table
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import start_query

TABLE = TableRef("integrity", "readings")
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("i32", pa.int32()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("name", pa.utf8()),
    ]
)
ROWS = 1_500
POSITIONS = 32
LEAKS = ("panicked", ".rs:", "/", "file:", "lance error")


def rows() -> pa.RecordBatch:
    ids = list(range(ROWS))
    return pa.RecordBatch.from_pydict(
        {
            "id": ids,
            "i32": [i * 7 - 5000 for i in ids],
            "f32": [i / 3 for i in ids],
            "f64": [i * 1.25 for i in ids],
            "name": [f"robot-{i:05d}" for i in ids],
        },
        schema=SCHEMA,
    )


def verify(meta_addr: str) -> VerifyTableResult:
    async def go() -> VerifyTableResult:
        async with MetaClient(f"http://{meta_addr}") as client:
            request = VerifyTableRequest(table=TABLE, all_versions=True)
            return await client.action(VERIFY_TABLE, request, VerifyTableResult)

    return asyncio.run(go())


def lake(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from lake_core.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("LAKE_")},
    )


def flip(path: Path, position: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ 0xFF]))


@pytest.mark.slow
def test_every_flipped_byte_is_reported_and_never_served(
    lake_cluster: LakeCluster, tmp_path: Path
) -> None:
    create_table(lake_cluster.meta.addr, TABLE, SCHEMA)
    with lake_sdk.connect(lake_cluster.query.url) as sdk:
        assert sdk.append_batches(TABLE, [rows()]) == 1
    dataset = lake_cluster.root / "data" / "tables" / "integrity" / "readings.lance"
    [data_file] = sorted((dataset / "data").glob("*.lance"))
    clean = verify(lake_cluster.meta.addr)
    assert clean.ok, clean
    assert (clean.files_checked, clean.unrecorded) == (1, [])

    size = data_file.stat().st_size
    positions = sorted({0, size - 1, *random.Random(11).sample(range(1, size - 1), POSITIONS - 2)})
    assert len(positions) == POSITIONS

    # A replica started while the file is already corrupt never verified it.
    flip(data_file, positions[0])
    env = {**lake_cluster.env, "LAKE_QUERY_VERIFY_ON_OPEN": "true"}
    checked = start_query(lake_cluster.meta.addr, tmp_path, env=env)
    try:
        flip(data_file, positions[0])
        for position in positions:
            flip(data_file, position)
            report = verify(lake_cluster.meta.addr)
            assert not report.ok, position
            [problem] = report.problems
            assert problem.path == data_file.name
            assert problem.problem == "sha256"
            assert problem.versions == [1]
            with lake_sdk.connect(checked.url) as sdk, pytest.raises(DataCorrupted) as caught:
                sdk.query_table(f"SELECT * FROM {TABLE.qualified}")
            message = str(caught.value)
            assert "integrity.readings version 1" in message, message
            assert not any(leak in message.lower() for leak in LEAKS), message
            if position in positions[:2]:
                cli = lake(
                    "client", "--addr", lake_cluster.meta.http_url, "verify-table", str(TABLE)
                )
                assert cli.returncode == 1, cli.stderr
                assert f"MISMATCH {TABLE} data/{data_file.name}" in cli.stdout
            flip(data_file, position)  # restore

        # Restored: verified once, then served.
        assert verify(lake_cluster.meta.addr).ok
        with lake_sdk.connect(checked.url) as sdk:
            table = sdk.query_table(f"SELECT * FROM {TABLE.qualified} ORDER BY id")
        assert table.equals(pa.Table.from_batches([rows()]))
    finally:
        checked.stop()

    flip(data_file, positions[5])
    lake_cluster.stop()
    local = lake(
        "table",
        "verify",
        str(TABLE),
        "--all-versions",
        "--json",
        "--data-dir",
        str(lake_cluster.root / "data"),
    )
    assert local.returncode == 1, local.stderr
    report = json.loads(local.stdout)
    assert [p["path"] for p in report["problems"]] == [data_file.name]
    flip(data_file, positions[5])
    local = lake("table", "verify", str(TABLE), "--data-dir", str(lake_cluster.root / "data"))
    assert local.returncode == 0, local.stdout + local.stderr
    assert "OK" in local.stdout


@pytest.mark.slow
def test_with_verification_off_a_corrupt_file_is_data_loss_or_correct_rows(
    lake_cluster: LakeCluster,
) -> None:
    create_table(lake_cluster.meta.addr, TABLE, SCHEMA)
    with lake_sdk.connect(lake_cluster.query.url) as sdk:
        assert sdk.append_batches(TABLE, [rows()]) == 1
    dataset = lake_cluster.root / "data" / "tables" / "integrity" / "readings.lance"
    [data_file] = sorted((dataset / "data").glob("*.lance"))
    size = data_file.stat().st_size
    positions = sorted({0, size - 1, *random.Random(11).sample(range(1, size - 1), POSITIONS - 2)})
    expected = pa.Table.from_batches([rows()])
    outcomes: list[tuple[int, str]] = []
    for position in positions:
        flip(data_file, position)
        try:
            with lake_sdk.connect(lake_cluster.query.url) as sdk:
                table = sdk.query_table(f"SELECT * FROM {TABLE.qualified} ORDER BY id")
            # Silently wrong rows are the documented limit (docs/integrity.md).
            outcomes.append((position, "rows" if table.equals(expected) else "wrong rows"))
        except DataCorrupted as exc:
            leaked = any(leak in str(exc).lower() for leak in LEAKS)
            outcomes.append((position, f"DATA_LOSS leaking: {exc}" if leaked else "DATA_LOSS"))
        except Exception as exc:  # the very thing this test looks for
            outcomes.append((position, f"{type(exc).__name__}: {str(exc)[:120]}"))
        flip(data_file, position)
    bad = [(p, o) for p, o in outcomes if o not in ("rows", "wrong rows", "DATA_LOSS")]
    assert not bad, bad
