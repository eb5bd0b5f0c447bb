"""Federation configuration: every rule refuses to start, names its variable, shows no secret."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from lake_core.errors import ConfigError
from lake_iceberg.federation import FederationConfig
from lake_iceberg.federation.locations import Locations
from lake_iceberg.federation.plugin import plugin
from lake_query.planning.external import PLUGIN_GROUP, load_external_catalogs
from tools.lake_testing.servers import free_port

SECRET = "s3cr3t-Value-9"
TOKEN = "tok-Value-77"
BASE = {
    "LAKE_ICEBERG_REST_ENDPOINT": "https://catalog.example.com",
    "LAKE_ICEBERG_WAREHOUSE": "s3://very-private-warehouse",
    "LAKE_ICEBERG_NAMESPACES": "analytics,models",
}


def _refused(env: dict[str, str], variable: str) -> str:
    with pytest.raises(ConfigError) as info:
        FederationConfig.from_env(env)
    message = str(info.value)
    assert variable in message
    for secret in (SECRET, TOKEN, "very-private-warehouse"):
        assert secret not in message
    return message


def test_unset_is_off_and_the_triple_is_on() -> None:
    assert FederationConfig.from_env({}) is None
    config = FederationConfig.from_env(BASE)
    assert config is not None
    assert config.namespaces == {"analytics", "models"}
    assert config.warehouse.reveal() == "s3://very-private-warehouse"
    assert "very-private-warehouse" not in repr(config)


@pytest.mark.parametrize("missing", sorted(BASE))
def test_a_partial_triple_refuses(missing: str) -> None:
    env = {k: v for k, v in BASE.items() if k != missing}
    _refused(env, missing)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LAKE_ICEBERG_REST_ENDPOINT", "http://catalog.example.com"),
        ("LAKE_ICEBERG_REST_ENDPOINT", "http://localhost:8181"),
        ("LAKE_ICEBERG_REST_ENDPOINT", "http://10.0.0.5:8181"),
        ("LAKE_ICEBERG_REST_ENDPOINT", f"https://user:{SECRET}@catalog.example.com"),
        ("LAKE_ICEBERG_REST_ENDPOINT", "ftp://catalog.example.com"),
        ("LAKE_ICEBERG_REST_ENDPOINT", "https://catalog.example.com/?token=x"),
        ("LAKE_ICEBERG_NAMESPACES", "analytics,,models"),
        ("LAKE_ICEBERG_NAMESPACES", "Bad-Name"),
    ],
)
def test_invalid_values_refuse(variable: str, value: str) -> None:
    _refused({**BASE, variable: value}, variable)


def test_loopback_ips_may_use_plain_http() -> None:
    for url in ("http://127.0.0.1:8181", "http://127.3.2.1:1", "http://[::1]:8181"):
        config = FederationConfig.from_env({**BASE, "LAKE_ICEBERG_REST_ENDPOINT": url})
        assert config is not None
        assert config.endpoint == url


def test_s3_override_rules() -> None:
    _refused(
        {**BASE, "LAKE_ICEBERG_S3_ENDPOINT": "https://s3.example.com"}, "LAKE_ICEBERG_S3_REGION"
    )
    _refused({**BASE, "LAKE_ICEBERG_S3_REGION": "eu-west-1"}, "LAKE_ICEBERG_S3_ENDPOINT")
    _refused(
        {
            **BASE,
            "LAKE_ICEBERG_S3_ENDPOINT": "http://s3.example.com",
            "LAKE_ICEBERG_S3_REGION": "r",
        },
        "LAKE_ICEBERG_S3_ENDPOINT",
    )
    for flag in ("LAKE_ICEBERG_S3_PATH_STYLE", "LAKE_ICEBERG_S3_ANONYMOUS"):
        for bad in ("yes", "1", "True", "TRUE", "on"):
            _refused({**BASE, flag: bad}, flag)
    config = FederationConfig.from_env(
        {
            **BASE,
            "LAKE_ICEBERG_S3_ENDPOINT": "http://127.0.0.1:9000",
            "LAKE_ICEBERG_S3_REGION": "us-east-1",
            "LAKE_ICEBERG_S3_PATH_STYLE": "true",
            "LAKE_ICEBERG_S3_ANONYMOUS": "false",
        }
    )
    assert config is not None
    assert config.file_io_overrides() == {
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.region": "us-east-1",
        "s3.path-style-access": "true",
    }


def test_storage_timeout_bounds_every_s3_request() -> None:
    for bad in ("99", "300001", "ten", "-1"):
        _refused({**BASE, "LAKE_ICEBERG_S3_TIMEOUT_MS": bad}, "LAKE_ICEBERG_S3_TIMEOUT_MS")
    default = FederationConfig.from_env(BASE)
    assert default is not None
    pyarrow_io = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    assert default.storage_bounds() == {
        **pyarrow_io,
        "s3.connect-timeout": "10.0",
        "s3.request-timeout": "10.0",
    }
    config = FederationConfig.from_env({**BASE, "LAKE_ICEBERG_S3_TIMEOUT_MS": "2500"})
    assert config is not None
    assert config.s3_timeout_s == 2.5
    assert config.storage_bounds() == {
        **pyarrow_io,
        "s3.connect-timeout": "2.5",
        "s3.request-timeout": "2.5",
    }


def test_auth_rules() -> None:
    _refused(
        {**BASE, "LAKE_ICEBERG_REST_TOKEN": TOKEN, "LAKE_ICEBERG_REST_CREDENTIAL": f"id:{SECRET}"},
        "LAKE_ICEBERG_REST_CREDENTIAL",
    )
    for bad in (SECRET, f":{SECRET}", "id:"):
        _refused({**BASE, "LAKE_ICEBERG_REST_CREDENTIAL": bad}, "LAKE_ICEBERG_REST_CREDENTIAL")
    for option in (
        "LAKE_ICEBERG_REST_OAUTH2_SERVER_URI",
        "LAKE_ICEBERG_REST_OAUTH_SCOPE",
        "LAKE_ICEBERG_REST_OAUTH_AUDIENCE",
        "LAKE_ICEBERG_REST_OAUTH_RESOURCE",
    ):
        message = _refused({**BASE, option: "https://idp.example.com/token"}, option)
        assert "LAKE_ICEBERG_REST_CREDENTIAL" in message
        _refused({**BASE, "LAKE_ICEBERG_REST_TOKEN": TOKEN, option: "x"}, option)
    _refused(
        {
            **BASE,
            "LAKE_ICEBERG_REST_CREDENTIAL": f"id:{SECRET}",
            "LAKE_ICEBERG_REST_OAUTH2_SERVER_URI": "http://idp.example.com/token",
        },
        "LAKE_ICEBERG_REST_OAUTH2_SERVER_URI",
    )
    oauth = FederationConfig.from_env(
        {
            **BASE,
            "LAKE_ICEBERG_REST_CREDENTIAL": f"id:{SECRET}",
            "LAKE_ICEBERG_REST_OAUTH_SCOPE": "s",
        }
    )
    assert oauth is not None
    assert oauth.oauth is not None
    assert oauth.oauth.scope == "s"
    assert SECRET not in repr(oauth)
    assert SECRET not in repr(oauth.oauth)
    static = FederationConfig.from_env({**BASE, "LAKE_ICEBERG_REST_TOKEN": TOKEN})
    assert static is not None
    assert TOKEN not in repr(static)


@pytest.mark.parametrize(
    "warehouse",
    ["very-private-warehouse", "s3:///very-private-warehouse", "wh/very-private-warehouse"],
)
def test_a_warehouse_that_is_no_location_needs_one(warehouse: str) -> None:
    """Query could not confine the files it opens: it refuses to start, naming the variables."""
    message = _refused({**BASE, "LAKE_ICEBERG_WAREHOUSE": warehouse}, "LAKE_ICEBERG_WAREHOUSE")
    assert "LAKE_ICEBERG_LOCATION" in message
    env = {**BASE, "LAKE_ICEBERG_WAREHOUSE": warehouse, "LAKE_ICEBERG_LOCATION": "s3://b/t"}
    config = FederationConfig.from_env(env)
    assert config is not None
    assert config.locations().allows("s3://b/t/x.parquet")
    assert not config.locations().allows("s3://very-private-warehouse/x.parquet")
    _refused(
        {**env, "LAKE_ICEBERG_LOCATION": "/very-private-warehouse/.."}, "LAKE_ICEBERG_LOCATION"
    )


@pytest.mark.parametrize(
    ("location", "inside"),
    [
        ("s3://lakewh/tables/ns/t/data/a.parquet", True),
        ("S3://lakewh/tables/a.parquet", True),  # schemes in any case
        ("s3a://lakewh/tables/a.parquet", True),  # one S3 client reads all three
        ("s3n://lakewh/tables/a.parquet", True),
        ("s3://lakewh/tables/a%20b.parquet", True),  # an encoded partition value
        ("s3://lakewh/tables2/a.parquet", False),  # a prefix ends at a segment
        ("s3://lakewh/other/a.parquet", False),
        ("s3://lakewh/tables", False),
        ("s3://elsewhere/tables/a.parquet", False),
        ("s3://LAKEWH/tables/a.parquet", False),
        ("s3://key:secret@lakewh/tables/a.parquet", False),
        ("s3://lakewh/tables/../other/a.parquet", False),
        ("s3://lakewh/tables/%2e%2E/other/a.parquet", False),
        ("s3://lakewh/tables/./a.parquet", False),
        ("s3://lakewh/tables/x%2F..%2F..%2Fother/a.parquet", False),
        ("s3://lakewh/tables/a.parquet?versionId=1", False),
        ("s3://lakewh/tables/a.parquet#x", False),
        ("s3://lakewh/tables\\..\\other/a.parquet", False),
        ("gs://lakewh/tables/a.parquet", False),
        ("file:///lakewh/tables/a.parquet", False),
        ("/lakewh/tables/a.parquet", False),
        ("lakewh/tables/a.parquet", False),
        ("", False),
    ],
)
def test_what_lies_inside_the_warehouse(location: str, inside: bool) -> None:
    assert Locations("s3://lakewh/tables/", "LAKE_ICEBERG_WAREHOUSE").allows(location) is inside


@pytest.mark.parametrize(
    ("location", "inside"),
    [
        ("file:///srv/wh/ns/t/a.parquet", True),
        ("/srv/wh/ns/t/a.parquet", True),
        ("file:/srv/wh/ns/t/a.parquet", True),
        ("file:///srv/wh/../../etc/passwd", False),
        ("/srv/wh/ns/../../../etc/passwd", False),
        ("file://otherhost/srv/wh/a.parquet", False),
        ("file:///srv/wharf/a.parquet", False),
        ("srv/wh/a.parquet", False),  # relative: resolved against the replica's cwd
        ("s3://srv/wh/a.parquet", False),
    ],
)
def test_a_local_warehouse_admits_only_its_own_directory(location: str, inside: bool) -> None:
    assert Locations("file:///srv/wh", "LAKE_ICEBERG_WAREHOUSE").allows(location) is inside


def test_an_option_without_the_triple_refuses() -> None:
    _refused({"LAKE_ICEBERG_REST_TOKEN": TOKEN}, "LAKE_ICEBERG_REST_TOKEN")


def test_set_without_the_plugin_names_the_install() -> None:
    with pytest.raises(ConfigError) as info:
        load_external_catalogs(BASE, plugins=[])
    assert "pip install ./packages/lake-iceberg" in str(info.value)
    assert "very-private-warehouse" not in str(info.value)
    assert load_external_catalogs({}, plugins=[]) == ()


def test_the_plugin_is_found_by_its_entry_point() -> None:
    entry = EntryPoint("iceberg", "lake_iceberg.federation.plugin:plugin", PLUGIN_GROUP)
    (catalog,) = load_external_catalogs(BASE, plugins=[entry])
    assert catalog.name == "iceberg"
    assert plugin({}) is None


def _start_query(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    return subprocess.run(
        [sys.executable, "-m", "lake_query", "--addr", f"127.0.0.1:{free_port()}"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (
            {k: v for k, v in BASE.items() if k != "LAKE_ICEBERG_NAMESPACES"},
            "LAKE_ICEBERG_NAMESPACES",
        ),
        ({**BASE, "LAKE_ICEBERG_REST_CREDENTIAL": SECRET}, "LAKE_ICEBERG_REST_CREDENTIAL"),
        ({**BASE, "LAKE_ICEBERG_S3_TIMEOUT_MS": "0"}, "LAKE_ICEBERG_S3_TIMEOUT_MS"),
        ({**BASE, "LAKE_ICEBERG_WAREHOUSE": "very-private-warehouse"}, "LAKE_ICEBERG_WAREHOUSE"),
    ],
)
def test_lake_query_refuses_to_start(env: dict[str, str], variable: str) -> None:
    """A real ``lake query`` exits before binding, naming the variable, showing no secret."""
    done = _start_query(env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert variable in done.stderr
    assert SECRET not in done.stderr + done.stdout
    assert "very-private-warehouse" not in done.stderr + done.stdout
    assert "listening" not in done.stderr
