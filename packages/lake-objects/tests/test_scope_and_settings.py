"""Tenant scope, stage descriptors and stage settings: pure checks, no I/O."""

from __future__ import annotations

import pytest

from lake_core.errors import ConfigError
from lake_objects import LocationOutsideStage, StageDescriptor, StageSettings, TenantScope

STAGE = "s3://bucket/lake/managed/tenants/acme"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/lake/managed/tenants/other/objects/x",
        "s3://bucket/lake/managed/tenants/acme/../other/x",
        "s3://bucket/lake/managed/tenants/acme/%2e%2e/x",
        "s3://bucket/lake/managed/tenants/acme/objects/%2E%2E",
        "s3://bucket/lake/managed/tenants/acme//x",
        "s3://bucket/lake/managed/tenants/acme/./x",
        "s3://bucket/lake/managed/tenants/acme/.hidden",
        "s3://bucket/lake/managed/tenants/acme",
        "s3://bucket/lake/managed/tenants/acme/",
        "s3://bucket/lake/managed/tenants/acmex/objects/x",
        "s3://other/lake/managed/tenants/acme/objects/x",
        "S3://bucket/lake/managed/tenants/acme/objects/x",
        "s3://bucket/lake/managed/tenants/acme/objects/x?versionId=2",
        "s3://bucket/lake/managed/tenants/acme/objects/x#frag",
        "s3://bucket/lake/managed/tenants/acme/objects\\..\\x",
        "s3://bucket/lake/managed/tenants/acme/objects/ x",
        "s3://bucket/lake/managed/tenants/acme/objects/\u2024\u2024/x",
        "/etc/passwd",
        "file:///etc/passwd",
        "",
    ],
)
def test_escapes_are_refused(uri: str) -> None:
    with pytest.raises(LocationOutsideStage):
        TenantScope(STAGE).check(uri)


def test_names_inside_the_child_prefix_are_accepted() -> None:
    scope = TenantScope(STAGE)
    assert scope.check(STAGE + "/objects/01a2-x") == "objects/01a2-x"
    assert scope.uri_for("objects/abc") == STAGE + "/objects/abc"


def test_descriptor_is_credential_free_and_well_formed() -> None:
    settings = StageSettings.s3(
        "bucket", "lake/managed", region="us-east-1", endpoint_url="http://127.0.0.1:9000"
    )
    descriptor = settings.descriptor("acme")
    assert descriptor.uri == STAGE
    assert descriptor.bucket == "bucket"
    assert descriptor.key_prefix == "lake/managed/tenants/acme"
    assert set(descriptor.model_dump()) == {
        "schema_version",
        "kind",
        "tenant_id",
        "uri",
        "region",
        "endpoint_url",
    }
    for endpoint in ("http://user:secret@host:9000", "http://host/path", "http://host?x=1"):
        with pytest.raises(ValueError):
            StageDescriptor(kind="s3", tenant_id="acme", uri=STAGE, endpoint_url=endpoint)
    with pytest.raises(ValueError):
        StageDescriptor(kind="s3", tenant_id="acme", uri="s3://bucket/tenants/other")
    with pytest.raises(LocationOutsideStage):
        settings.descriptor("../other")


def test_settings_from_env() -> None:
    assert StageSettings.from_env({}) is None
    local = StageSettings.from_env({}, default_local_root="/data/objects")
    assert local is not None
    assert local.descriptor("local").uri == "file:///data/objects/tenants/local"
    s3 = StageSettings.from_env({"LAKE_S3_BUCKET": "bkt", "AWS_REGION": "eu-west-1"})
    assert s3 is not None
    assert s3.base_uri == "s3://bkt/managed-objects"
    assert s3.region == "eu-west-1"
    root = StageSettings.from_env({"LAKE_S3_BUCKET": "bkt", "LAKE_MANAGED_OBJECT_PREFIX": "/"})
    assert root is not None
    assert root.descriptor("t").uri == "s3://bkt/tenants/t"
    for env in (
        {"LAKE_S3_BUCKET": "bkt", "LAKE_MANAGED_OBJECT_ROOT": "/x"},
        {"LAKE_S3_BUCKET": "Bad_Bucket"},
        {"LAKE_S3_BUCKET": "bkt", "LAKE_MANAGED_OBJECT_PREFIX": "a/../b"},
        {"LAKE_MANAGED_OBJECT_ROOT": "/tmp/with space"},
        {"LAKE_MANAGED_OBJECT_ROOT": "/tmp/50%"},
    ):
        with pytest.raises(ConfigError):
            StageSettings.from_env(env)
