"""Cloud settings: parsed and validated without I/O; locations derived, never chosen."""

from __future__ import annotations

import pytest

from lake_core.cloud import CloudSettings, DatasetStorage, cloud_mode, split_s3_uri
from lake_core.errors import ConfigError
from lake_core.names import TableRef

BASE = {
    "LAKE_CLOUD_MODE": "true",
    "LAKE_S3_BUCKET": "embodied-data",
    "AWS_REGION": "us-east-1",
}


def test_local_mode_unless_asked() -> None:
    assert CloudSettings.from_env({}) is None
    assert CloudSettings.from_env({"LAKE_S3_BUCKET": "embodied-data"}) is None
    assert not cloud_mode({"LAKE_CLOUD_MODE": "false"})
    with pytest.raises(ConfigError, match="LAKE_CLOUD_MODE"):
        cloud_mode({"LAKE_CLOUD_MODE": "maybe"})


def test_defaults_and_derived_locations() -> None:
    settings = CloudSettings.from_env(BASE)
    assert settings is not None
    assert settings.registry_table == "lake_registry"
    assert settings.storage.manifest_table == "lake_manifests"
    assert settings.storage.timeout_ms == 10_000
    table = TableRef("robots", "episodes")
    # LAKE_TABLE_PREFIX defaults to the bucket root.
    assert settings.table_location(table) == "s3://embodied-data/robots/episodes.lance"
    prefixed = CloudSettings.from_env({**BASE, "LAKE_TABLE_PREFIX": "/lake/tables/"})
    assert prefixed is not None
    assert prefixed.table_location(table) == "s3://embodied-data/lake/tables/robots/episodes.lance"
    assert prefixed.sidecar_prefix == "lake/tables/_lake-sidecars"


def test_lance_uri_and_options_for_s3_only() -> None:
    storage = DatasetStorage.from_env(
        {
            "LAKE_MANIFEST_DYNAMODB_TABLE": "manifests_v1",
            "AWS_REGION": "eu-west-1",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:8000",
            "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "very-secret-value",
            "LAKE_STORAGE_TIMEOUT_MS": "2500",
        }
    )
    location = "s3://bucket/p/robots/episodes.lance"
    assert storage.lance_uri(location) == (
        "s3+ddb://bucket/p/robots/episodes.lance?ddbTableName=manifests_v1"
    )
    assert storage.manifest_base_uri(location) == "p/robots/episodes.lance"
    options = storage.storage_options(location)
    assert options is not None
    assert options["endpoint"] == "http://127.0.0.1:9000"  # AWS_ENDPOINT_URL as the S3 fallback
    assert options["dynamodb_endpoint"] == "http://127.0.0.1:8000"
    assert options["allow_http"] == "true"
    assert options["region"] == "eu-west-1"
    assert options["timeout"] == "2500ms"
    assert options["aws_secret_access_key"] == "very-secret-value"
    assert "very-secret-value" not in repr(storage)
    # Local paths are untouched.
    assert storage.lance_uri("/data/tables/a/b.lance") == "/data/tables/a/b.lance"
    assert storage.storage_options("/data/tables/a/b.lance") is None
    assert split_s3_uri(location) == ("bucket", "p/robots/episodes.lance")


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"LAKE_S3_BUCKET": ""}, "LAKE_S3_BUCKET"),
        ({"LAKE_S3_BUCKET": "Bad_Bucket"}, "LAKE_S3_BUCKET"),
        ({"AWS_REGION": ""}, "AWS_REGION"),
        ({"AWS_REGION": "Mars One"}, "AWS_REGION"),
        ({"LAKE_DYNAMODB_TABLE": "x"}, "LAKE_DYNAMODB_TABLE"),
        ({"LAKE_MANIFEST_DYNAMODB_TABLE": "has space"}, "LAKE_MANIFEST_DYNAMODB_TABLE"),
        ({"LAKE_DYNAMODB_TABLE": "shared", "LAKE_MANIFEST_DYNAMODB_TABLE": "shared"}, "different"),
        ({"LAKE_TABLE_PREFIX": "a/../b"}, "LAKE_TABLE_PREFIX"),
        ({"LAKE_TABLE_PREFIX": "a//b"}, "LAKE_TABLE_PREFIX"),
        ({"LAKE_TABLE_PREFIX": "lake/_lake-sidecars"}, "reserved"),
        ({"AWS_ENDPOINT_URL_S3": "ftp://host"}, "AWS_ENDPOINT_URL_S3"),
        ({"AWS_ENDPOINT_URL_DYNAMODB": "http://user:pw@host:8000"}, "credentials"),
        ({"LAKE_STORAGE_TIMEOUT_MS": "0"}, "LAKE_STORAGE_TIMEOUT_MS"),
    ],
)
def test_bad_values_name_what_to_fix(changes: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as caught:
        CloudSettings.from_env({**BASE, **changes})
    assert "pw@" not in str(caught.value)
