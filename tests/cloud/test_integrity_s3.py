"""Data-file integrity for S3 tables: recorded at commit, rechecked by verify and on open.

Cloud mode on SeaweedFS + dynalite. Metasrv records the size and SHA-256 of
every data file an append or a compaction writes, as objects under
``<table prefix>/_lake-integrity``. One byte of the table's data object is
flipped at several positions in turn (first and last byte included), each
time by rewriting the object in the bucket:

- Metasrv's verify action reports exactly that file;
- a replica with ``LAKE_QUERY_VERIFY_ON_OPEN=true`` fails every query with
  DATA_LOSS (:class:`DataCorrupted`) naming table and version, never a URI,
  bucket, key or panic text;

and once the bytes are restored both answer normally again. An S3 outage
during verification is UNAVAILABLE, never a verdict on the file.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core.errors import DataCorrupted, Unavailable
from lake_core.integrity import VERIFY_TABLE, VerifyTableRequest, VerifyTableResult
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from tests.cloud.conftest import TABLE_PREFIX, CloudLake
from tools.lake_testing.seaweed import SeaweedS3

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.dynamodb]

TABLE = TableRef("robots", "readings")
SCHEMA = pa.schema([("id", pa.int64()), ("reward", pa.float64()), ("name", pa.utf8())])
ROWS = 1_000
POSITIONS = 6
LEAKS = ("panicked", ".rs:", "s3://", "lance error", "_lake", "warehouse")


def rows(start: int) -> pa.RecordBatch:
    ids = list(range(start, start + ROWS))
    return pa.RecordBatch.from_pydict(
        {"id": ids, "reward": [i / 4 for i in ids], "name": [f"r-{i:05d}" for i in ids]},
        schema=SCHEMA,
    )


def verify(lake: CloudLake, *, all_versions: bool = True) -> VerifyTableResult:
    async def work(client: MetaClient) -> VerifyTableResult:
        request = VerifyTableRequest(table=TABLE, all_versions=all_versions)
        return await client.action(VERIFY_TABLE, request, VerifyTableResult)

    # Straight to the node: the test's TCP balancer is not what is under test.
    result: VerifyTableResult = lake.admin(work, target=lake.metas[0])
    return result


def data_keys(lake: CloudLake) -> list[str]:
    prefix = f"{TABLE_PREFIX}/{TABLE.namespace}/{TABLE.name}.lance/data/"
    listing = lake.s3.client().list_objects_v2(Bucket=lake.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def flip(lake: CloudLake, key: str, position: int) -> None:
    s3 = lake.s3.client()
    body = bytearray(s3.get_object(Bucket=lake.bucket, Key=key)["Body"].read())
    body[position] ^= 0xFF
    s3.put_object(Bucket=lake.bucket, Key=key, Body=bytes(body))


def test_s3_data_files_are_recorded_verified_and_never_served_corrupt(
    make_cloud_lake,
) -> None:
    lake = make_cloud_lake()
    _, plain = lake.start_meta_and_query()
    lake.admin(lambda c: c.create_table(TABLE, SCHEMA))
    with lake.sdk(plain) as client:
        assert client.append_batches(TABLE, [rows(0)]) == 1
        assert client.append_batches(TABLE, [rows(ROWS)]) == 2

    records = lake.s3.client().list_objects_v2(
        Bucket=lake.bucket, Prefix=f"{TABLE_PREFIX}/_lake-integrity/"
    )
    assert len(records.get("Contents", [])) == 2  # one record per appended version

    clean = verify(lake)
    assert clean.ok, clean
    assert (clean.versions, clean.files_checked, clean.unrecorded) == ([0, 1, 2], 2, [])

    # Compaction rewrites both fragments into one; its file is recorded too.
    before = set(data_keys(lake))
    lake.admin(lambda c: c.optimize_table(TABLE))
    [key] = sorted(set(data_keys(lake)) - before)
    name = key.rsplit("/", 1)[1]
    compacted = verify(lake, all_versions=False)
    assert compacted.ok, compacted
    assert (compacted.files_checked, compacted.unrecorded) == (1, [])

    size = lake.s3.client().head_object(Bucket=lake.bucket, Key=key)["ContentLength"]
    positions = sorted({0, size - 1, *random.Random(5).sample(range(1, size - 1), POSITIONS - 2)})
    lake.query_env["LAKE_QUERY_VERIFY_ON_OPEN"] = "true"
    checked = lake.start_query()
    for position in positions:
        flip(lake, key, position)
        report = verify(lake, all_versions=False)
        assert not report.ok, position
        [problem] = report.problems
        assert (problem.path, problem.problem) == (name, "sha256"), problem
        with lake.sdk(checked) as client, pytest.raises(DataCorrupted) as caught:
            client.query_table(f"SELECT * FROM {TABLE.qualified}")
        message = str(caught.value)
        assert f"{TABLE.qualified} version 2" in message, message
        assert not any(leak in message.lower() for leak in LEAKS), message
        flip(lake, key, position)  # restore

    assert verify(lake).ok
    with lake.sdk(checked) as client:
        table = client.query_table(f"SELECT count(*) AS n FROM {TABLE.qualified}")
    assert table["n"][0].as_py() == 2 * ROWS


def test_s3_outage_during_verify_is_unavailable(make_cloud_lake, tmp_path: Path) -> None:
    s3 = SeaweedS3(tmp_path / "own-s3").start()  # this test pauses it
    try:
        lake = make_cloud_lake(s3=s3)
        _, query = lake.start_meta_and_query()
        lake.admin(lambda c: c.create_table(TABLE, SCHEMA))
        with lake.sdk(query) as client:
            client.append_batches(TABLE, [rows(0)])
        assert verify(lake).ok
        s3.pause()
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable):
                verify(lake)
            assert time.monotonic() - started < 45
        finally:
            s3.resume()
        assert verify(lake).ok
    finally:
        s3.stop()
