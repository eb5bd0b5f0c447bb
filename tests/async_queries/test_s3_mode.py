"""S3 mode: job state in DynamoDB (dynalite), result parts on S3 (SeaweedFS)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator

import boto3
import pytest

from lake_core.errors import ResultTooLarge
from lake_query.jobs.results import CHUNK_BYTES, UPLOAD_PIECE_BYTES, S3Results
from tests.async_queries.conftest import SQL, AsyncLake, client
from tests.async_queries.test_lifecycle import CRASHING, FAST_LEASE, wait_finished
from tools.lake_testing.data import EPISODES, episodes
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3

pytestmark = [pytest.mark.s3, pytest.mark.dynamodb]


def test_s3_mode_survives_a_dead_worker_and_resumes_on_another_replica(
    async_lake: AsyncLake,
    loaded: Callable[[int], None],
    s3_server: SeaweedS3,
    s3_bucket: str,
    dynamodb_server: Dynalite,
) -> None:
    cloud = {
        **s3_server.env(),
        "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_server.endpoint,
        "AWS_REGION": "us-east-1",
        "LAKE_S3_BUCKET": s3_bucket,
        "LAKE_ASYNC_DYNAMODB_TABLE": "async_jobs_test",
        "LAKE_ASYNC_RESULT_PREFIX": "results/async",
    }
    accepting = async_lake.add_query({**cloud, **CRASHING})
    loaded(3000)
    with client(accepting) as sdk:
        interactive = sdk.query_table(SQL)
        handle = sdk.jobs.submit(SQL)
    assert accepting.proc is not None
    assert accepting.proc.wait(timeout=120) == 137  # died after storing its first part

    other = async_lake.add_query({**cloud, **FAST_LEASE})
    with client(other) as sdk:
        sdk.append_batches(EPISODES, [episodes(3000, 200)])
        assert wait_finished(sdk, handle).state == "done"
        assert sdk.jobs.resume(handle).to_table().equals(interactive)

    # Nothing of the job in the local directories: S3 and DynamoDB hold it.
    assert not (async_lake.data_dir / "async-query-state").exists()
    s3 = s3_server.client()
    keys = [
        o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket, Prefix="results/async/")["Contents"]
    ]
    manifests = [k for k in keys if k.endswith("manifest.json")]
    assert len(manifests) == 1
    assert manifests[0].split("/")[-2] == "2"  # the reclaiming attempt's, none for the dead one
    dynamo = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id="dynalite",
        aws_secret_access_key="dynalite",
    )
    items = dynamo.scan(TableName="async_jobs_test")["Items"]
    families = {item["pk"]["S"].split("#")[0] for item in items}
    assert {"job", "slots"} <= families
    assert all("#" in item["pk"]["S"] for item in items)


def test_a_large_s3_part_streams_in_pieces_and_a_failed_one_leaves_nothing(
    s3_server: SeaweedS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    data = os.urandom(2 * UPLOAD_PIECE_BYTES + 12345)
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]

    def failing() -> Iterator[bytes]:
        yield from chunks[: len(chunks) // 2]  # more than one piece already uploaded
        raise ResultTooLarge("the async result is larger than its byte ceiling")

    async def go() -> bytes:
        store = await S3Results(
            s3_bucket, "results/async", endpoint_url=s3_server.endpoint, region="us-east-1"
        ).open()
        try:
            assert await store.write_object("job/1/part-00000.arrows", iter(chunks)) == len(data)
            with pytest.raises(ResultTooLarge):
                await store.write_object("job/1/part-00001.arrows", failing())
            return b"".join([c async for c in store.read_chunks("job/1/part-00000.arrows")])
        finally:
            await store.close()

    assert asyncio.run(go()) == data
    s3 = s3_server.client()
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="results/async/")["Contents"]
    assert [o["Key"] for o in listed] == ["results/async/job/1/part-00000.arrows"]
    # Three pieces, not one buffered PUT (a multipart ETag ends in its part count).
    assert listed[0]["ETag"].strip('"').endswith("-3")
    assert not s3.list_multipart_uploads(Bucket=s3_bucket).get("Uploads")
