"""Cloud-mode configuration of Metasrv: validated before any listener binds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lake_core.errors import ConfigError
from lake_metasrv.cli import table
from lake_metasrv.config import MetaConfig

CLOUD = {
    "LAKE_CLOUD_MODE": "true",
    "LAKE_S3_BUCKET": "embodied-data",
    "AWS_REGION": "us-east-1",
}


def test_cloud_defaults(tmp_path: Path) -> None:
    config = MetaConfig.load(data_dir=tmp_path / "unused", env=CLOUD)
    assert config.cloud is not None
    assert config.cloud.registry_table == "lake_registry"
    assert config.cloud.storage.manifest_table == "lake_manifests"
    assert config.lease_ttl_s == 10.0
    assert not config.faults.armed
    assert config.advertise_url is None
    assert config.stage is not None
    assert config.stage.kind == "s3"
    assert not (tmp_path / "unused").exists()
    assert MetaConfig.load(data_dir=tmp_path, env={"LAKE_S3_BUCKET": "b-1"}).cloud is None


def test_test_hooks_only_apply_through_lake_faults(tmp_path: Path) -> None:
    old = {"LAKE_TEST_HOOKS": "1", "LAKE_TEST_LEASE_TTL_MS": "2000"}
    plain = MetaConfig.load(data_dir=tmp_path, env={**CLOUD, **old})
    assert (plain.lease_ttl_s, plain.faults.armed) == (10.0, False)
    spec = "meta.lease_ttl_ms=2000,meta.stop_before_head_update"
    hooked = MetaConfig.load(data_dir=tmp_path, env={**CLOUD, "LAKE_FAULTS": spec})
    assert hooked.lease_ttl_s == 2.0
    assert hooked.faults.points == {"meta.stop_before_head_update"}
    with pytest.raises(ConfigError, match="LAKE_FAULTS"):
        MetaConfig.load(data_dir=tmp_path, env={**CLOUD, "LAKE_FAULTS": "meta.lease_ttl_ms=100"})


@pytest.mark.parametrize(
    ("changes", "addr", "named"),
    [
        ({}, "0.0.0.0:50052", "LAKE_PEER_ADVERTISE_URL"),
        ({"LAKE_PEER_ADVERTISE_URL": "lake-meta-0:50052"}, "127.0.0.1:50052", "http"),
        ({"LAKE_PEER_ADVERTISE_URL": "http://10.0.0.5:50052"}, "127.0.0.1:50052", "plaintext"),
        ({"LAKE_DYNAMODB_TABLE": "lake_manifests"}, "127.0.0.1:50052", "different"),
        ({"LAKE_S3_BUCKET": ""}, "127.0.0.1:50052", "LAKE_S3_BUCKET"),
        ({"AWS_REGION": ""}, "127.0.0.1:50052", "AWS_REGION"),
    ],
)
def test_bad_cloud_settings(tmp_path: Path, changes: dict[str, str], addr: str, named: str) -> None:
    env = {**CLOUD, **changes}
    if addr.startswith("0.0.0.0"):
        token = tmp_path / "admin-token"
        token.write_text("lk_" + "x" * 30)
        token.chmod(0o600)
        env.update({"LAKE_AUTH_TOKEN_FILE": str(token), "LAKE_ALLOW_INSECURE": "true"})
    with pytest.raises(ConfigError, match=named):
        MetaConfig.load(data_dir=tmp_path, addr=addr, env=env)


def test_bad_cloud_settings_fail_startup_before_binding(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, **CLOUD, "LAKE_MANIFEST_DYNAMODB_TABLE": "lake_registry"}
    proc = subprocess.run(
        [sys.executable, "-m", "lake_metasrv", "--addr", f"127.0.0.1:{port}"],
        env=env,
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert b"LAKE_DYNAMODB_TABLE" in proc.stderr
    assert b"listening" not in proc.stderr
    assert not (tmp_path / "lake-data").exists()


def test_lake_table_refuses_cloud_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CLOUD.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(table, ["list", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 2
    assert "lake client" in result.output
