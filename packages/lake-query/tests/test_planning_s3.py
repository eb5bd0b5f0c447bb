"""Query opens S3 tables read-only, from S3 alone when it can.

No registry access: the descriptor (location, incarnation, engine version)
plus :class:`~lake_core.cloud.DatasetStorage` is all a replica needs. A
registered version's manifest is at its own path in S3, so a DynamoDB outage
does not stop reads; one a crash left named in DynamoDB alone is opened
through the manifest table.
"""

from __future__ import annotations

import boto3
import lance
import pyarrow as pa
import pytest

from lake_core.cloud import DatasetStorage
from lake_core.errors import ConfigError, VersionReclaimed
from lake_core.models import TableDescriptor, incarnation_metadata
from lake_core.names import TableRef
from lake_query.config import QueryConfig
from lake_query.planning import open_pinned
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3

T = TableRef("robots", "episodes")


@pytest.mark.s3
@pytest.mark.dynamodb
def test_open_pinned_reads_an_s3_table_through_its_manifest_table(
    s3_server: SeaweedS3, s3_bucket: str, dynamodb_server: Dynalite, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**s3_server.env(), **dynamodb_server.env()}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    manifests = dynamodb_server.manifest_table()
    storage = DatasetStorage.from_env({**env, "LAKE_MANIFEST_DYNAMODB_TABLE": manifests})
    location = f"s3://{s3_bucket}/lake/robots/episodes.lance"
    schema = pa.schema([("id", pa.int64())]).with_metadata(incarnation_metadata("inc-7"))
    options = storage.storage_options(location)
    lance.write_dataset(
        schema.empty_table(), storage.lance_uri(location), mode="create", storage_options=options
    )
    v2 = lance.write_dataset(
        pa.table({"id": [1, 2]}, schema=schema),
        storage.lance_uri(location),
        mode="append",
        storage_options=options,
    ).version
    lance.write_dataset(
        pa.table({"id": [3]}, schema=schema),
        storage.lance_uri(location),
        mode="append",
        storage_options=options,
    )

    pinned = TableDescriptor(location=location, incarnation="inc-7", version=1, engine_version=v2)
    dataset = open_pinned(T, pinned, storage)
    assert dataset.to_table()["id"].to_pylist() == [1, 2]  # the pin, not the latest
    with pytest.raises(VersionReclaimed):
        open_pinned(T, pinned.model_copy(update={"engine_version": 99}), storage)
    with pytest.raises(VersionReclaimed):  # dropped and recreated: another incarnation
        open_pinned(T, pinned.model_copy(update={"incarnation": "inc-8"}), storage)

    # A writer killed after DynamoDB named its staged manifest, before the copy
    # to the version's own path: only the manifest table knows that version.
    s3 = s3_server.client()
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="lake/robots/episodes.lance/_versions/")
    final = sorted(o["Key"] for o in listed["Contents"])[0]  # the newest (v3): inverted names
    staged = f"{final}-0b5e7c1e-6a9f-4d7e-9a49-2c1f0d3e5b77"
    s3.copy_object(Bucket=s3_bucket, Key=staged, CopySource={"Bucket": s3_bucket, "Key": final})
    s3.delete_object(Bucket=s3_bucket, Key=final)
    dynamodb = boto3.client(
        "dynamodb", endpoint_url=dynamodb_server.endpoint, region_name=dynamodb_server.region
    )
    dynamodb.update_item(
        TableName=manifests,
        Key={"base_uri": {"S": storage.manifest_base_uri(location)}, "version": {"N": "3"}},
        UpdateExpression="SET #p = :staged",
        ExpressionAttributeNames={"#p": "path"},
        ExpressionAttributeValues={":staged": {"S": staged}},
    )
    newest = pinned.model_copy(update={"version": 2, "engine_version": 3})
    assert sorted(open_pinned(T, newest, storage).to_table()["id"].to_pylist()) == [1, 2, 3]

    # DynamoDB down: registered versions still open, from S3 alone.
    dynamodb_server.stop()
    assert open_pinned(T, pinned, storage).to_table()["id"].to_pylist() == [1, 2]
    assert sorted(open_pinned(T, newest, storage).to_table()["id"].to_pylist()) == [1, 2, 3]


def test_query_config_validates_table_storage_before_binding() -> None:
    config = QueryConfig.load(env={"LAKE_MANIFEST_DYNAMODB_TABLE": "fleet_manifests"})
    assert config.storage.manifest_table == "fleet_manifests"
    assert QueryConfig.load(env={}).storage.manifest_table == "lake_manifests"
    with pytest.raises(ConfigError, match="LAKE_STORAGE_TIMEOUT_MS"):
        QueryConfig.load(env={"LAKE_STORAGE_TIMEOUT_MS": "soon"})
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL_S3"):
        QueryConfig.load(env={"AWS_ENDPOINT_URL_S3": "s3.internal:9000"})
