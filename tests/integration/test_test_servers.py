"""The real servers the suite leans on behave as the tests assume."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError

from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3


@pytest.mark.s3
def test_seaweed_checks_signatures_ranges_and_expiry(s3_server: SeaweedS3, s3_bucket: str) -> None:
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="k", Body=b"0123456789")
    ranged = client.get_object(Bucket=s3_bucket, Key="k", Range="bytes=2-4")
    assert ranged["ContentRange"] == "bytes 2-4/10"
    assert ranged["Body"].read() == b"234"
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": s3_bucket, "Key": "k"}, ExpiresIn=1
    )
    assert urllib.request.urlopen(url).read() == b"0123456789"
    time.sleep(2.2)
    with pytest.raises(urllib.error.HTTPError, match="403"):
        urllib.request.urlopen(url)
    stranger = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name=s3_server.region,
        aws_access_key_id="nobody",
        aws_secret_access_key="wrong",
    )
    with pytest.raises(ClientError, match=r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch"):
        stranger.get_object(Bucket=s3_bucket, Key="k")


@pytest.mark.dynamodb
def test_dynalite_keeps_data_across_restarts(dynamodb_server: Dynalite) -> None:
    client = boto3.client(
        "dynamodb",
        endpoint_url=dynamodb_server.endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    client.create_table(
        TableName="probe",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName="probe", WaiterConfig={"Delay": 0.2})
    client.put_item(TableName="probe", Item={"pk": {"S": "a"}, "v": {"N": "1"}})
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        client.put_item(
            TableName="probe",
            Item={"pk": {"S": "a"}, "v": {"N": "2"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    dynamodb_server.restart()
    item = client.get_item(TableName="probe", Key={"pk": {"S": "a"}}, ConsistentRead=True)["Item"]
    assert item["v"] == {"N": "1"}
