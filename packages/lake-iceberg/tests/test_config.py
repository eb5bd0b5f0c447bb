"""Every rule of the registrar's configuration notes, checked at startup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from lake_iceberg.errors import ConfigInvalid
from lake_iceberg.registrar.config import RetryPolicy, load_config, parse_config, parse_duration
from lake_iceberg.registrar.tables import catalog_properties
from tools.lake_testing.tls import TestCA, issue_client_cert


def base(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "from": "/var/lib/lake/segments",
        "pipeline": "edge-capture",
        "catalog_uri": "http://127.0.0.1:8181",
        "url": "s3://warehouse/lake",
        "namespace": "robotics",
    }
    config.update(overrides)
    return {k: v for k, v in config.items() if v is not None}


def test_minimal_config_and_defaults() -> None:
    config = parse_config(base())
    assert config.namespace == ("robotics",)
    assert config.create_table is False
    assert config.retry == RetryPolicy(initial=1.0, max=60.0, jitter=True)
    assert config.table_location("pose") == "s3://warehouse/lake/lake/v1/edge-capture/pose"


def test_dotted_namespace_is_two_levels() -> None:
    assert parse_config(base(namespace="a.b")).namespace == ("a", "b")
    with pytest.raises(ConfigInvalid, match="namespace"):
        parse_config(base(namespace="a..b"))


def test_sinks_document_uses_its_iceberg_entry(tmp_path: Path) -> None:
    document = {
        "sinks": [
            {"id": "local", "kind": "parquet", "config": {"datasets": ["t"]}},
            {"id": "iceberg", "kind": "iceberg", "config": base(**{"from": "segments"})},
        ]
    }
    path = tmp_path / "lake.yaml"
    path.write_text(yaml.safe_dump(document))
    config = load_config(path)
    assert config.segments_dir == tmp_path / "segments"  # relative to the file
    two = {"sinks": [document["sinks"][1], document["sinks"][1]]}
    with pytest.raises(ConfigInvalid, match="exactly one kind: iceberg"):
        parse_config(two)


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ConfigInvalid, match="unknown key"):
        parse_config(base(catalog_tokne="x"))
    with pytest.raises(ConfigInvalid, match="store: unknown key"):
        parse_config(base(store={"endpiont": "http://x"}))


def test_token_and_credential_together_are_refused() -> None:
    with pytest.raises(ConfigInvalid, match="one, not both"):
        parse_config(
            base(catalog_token="t", catalog_credential={"client_id": "c", "client_secret": "s"})
        )


def test_client_id_with_colon_is_refused() -> None:
    with pytest.raises(ConfigInvalid, match="client_id"):
        parse_config(base(catalog_credential={"client_id": "a:b", "client_secret": "s"}))


def test_secrets_from_file_and_env_never_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("s3cr3t-token\n")
    monkeypatch.setenv("LAKE_TEST_KEY_SECRET", "k3y-s3cr3t")
    config = parse_config(
        base(
            catalog_token=f"${{file:{tmp_path / 'token'}}}",
            store={"access_key_id": "AKID", "secret_access_key": "${env:LAKE_TEST_KEY_SECRET}"},
        )
    )
    assert config.catalog_token is not None
    assert config.catalog_token.reveal() == "s3cr3t-token"
    assert config.store.secret_access_key is not None
    assert config.store.secret_access_key.reveal() == "k3y-s3cr3t"
    assert "s3cr3t" not in repr(config)
    assert "s3cr3t" not in str(config)
    assert catalog_properties(config)["token"] == "s3cr3t-token"


def test_missing_secret_names_the_key_not_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKE_TEST_NOPE", raising=False)
    with pytest.raises(ConfigInvalid, match="catalog_token: environment variable LAKE_TEST_NOPE"):
        parse_config(base(catalog_token="${env:LAKE_TEST_NOPE}"))
    with pytest.raises(ConfigInvalid, match="cannot read secret file"):
        parse_config(base(catalog_token="${file:/nonexistent/token}"))


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


def test_ca_file_only_with_https(ca: TestCA) -> None:
    with pytest.raises(ConfigInvalid, match="only with an https"):
        parse_config(base(catalog_ca_file=str(ca.cert_file)))
    config = parse_config(base(catalog_uri="https://cat:8181", catalog_ca_file=str(ca.cert_file)))
    assert catalog_properties(config)["ssl"] == {"cabundle": str(ca.cert_file)}


def test_ca_file_must_hold_a_certificate(tmp_path: Path) -> None:
    empty = tmp_path / "ca.pem"
    empty.write_text("")
    with pytest.raises(ConfigInvalid, match="catalog_ca_file"):
        parse_config(base(catalog_uri="https://cat", catalog_ca_file=str(empty)))
    with pytest.raises(ConfigInvalid, match="not a readable file"):
        parse_config(base(catalog_uri="https://cat", catalog_ca_file=str(tmp_path / "missing")))


def test_mutual_tls_pair_together_and_https_only(ca: TestCA) -> None:
    client = issue_client_cert(ca, "registrar")
    with pytest.raises(ConfigInvalid, match="set both or neither"):
        parse_config(base(catalog_uri="https://cat", catalog_client_cert=str(client.cert_file)))
    with pytest.raises(ConfigInvalid, match="needs an https"):
        parse_config(
            base(catalog_client_cert=str(client.cert_file), catalog_client_key=str(client.key_file))
        )
    with pytest.raises(ConfigInvalid, match="PEM certificate and its private key"):
        parse_config(
            base(
                catalog_uri="https://cat",
                catalog_client_cert=str(client.cert_file),
                catalog_client_key=str(ca.cert_file),
            )
        )
    config = parse_config(
        base(
            catalog_uri="https://cat",
            catalog_client_cert=str(client.cert_file),
            catalog_client_key=str(client.key_file),
        )
    )
    assert catalog_properties(config)["ssl"]["client"]["key"] == str(client.key_file)


def test_credentials_over_non_loopback_http_warn() -> None:
    with capture_logs() as logs:
        parse_config(base(catalog_uri="http://catalog.internal:8181", catalog_token="t"))
        parse_config(base(catalog_uri="http://127.0.0.1:8181", catalog_token="t"))
        parse_config(
            base(
                catalog_uri="https://catalog.internal",
                catalog_credential={
                    "client_id": "c",
                    "client_secret": "s",
                    "oauth2_server_uri": "http://auth.internal/token",
                },
            )
        )
        parse_config(base(catalog_uri="http://catalog.internal:8181"))  # no credentials
    warned = [e["url"] for e in logs if e["event"] == "registrar.cleartext_credentials"]
    assert warned == ["http://catalog.internal:8181", "http://auth.internal/token"]
    assert all(e.get("token") != "t" for e in logs)


def test_store_http_needs_allow_http_and_both_keys() -> None:
    with pytest.raises(ConfigInvalid, match="allow_http"):
        parse_config(base(store={"endpoint": "http://127.0.0.1:9000"}))
    with pytest.raises(ConfigInvalid, match="set both or neither"):
        parse_config(base(store={"access_key_id": "a"}))


def test_urls_and_names_are_checked() -> None:
    with pytest.raises(ConfigInvalid, match="url"):
        parse_config(base(url="gs://bucket/x"))
    with pytest.raises(ConfigInvalid, match="catalog_uri"):
        parse_config(base(catalog_uri="ftp://cat"))
    with pytest.raises(ConfigInvalid, match="pipeline"):
        parse_config(base(pipeline="a/b"))
    with pytest.raises(ConfigInvalid, match="from: required"):
        parse_config(base(**{"from": None}))


def test_retry_durations() -> None:
    assert parse_duration("500ms", "k") == 0.5
    assert parse_duration("2m", "k") == 120.0
    assert parse_duration(3, "k") == 3.0
    with pytest.raises(ConfigInvalid, match=r"retry\.initial"):
        parse_config(base(retry={"initial": "soon"}))
    with pytest.raises(ConfigInvalid, match=r"at least retry\.initial"):
        parse_config(base(retry={"initial": "10s", "max": "1s"}))
    policy = RetryPolicy(initial=1.0, max=8.0, jitter=False)
    assert [policy.delay(i) for i in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    jittered = RetryPolicy(initial=1.0, max=8.0, jitter=True)
    assert 0.5 <= jittered.delay(0, 0.0) <= jittered.delay(0, 0.99) <= 1.0
