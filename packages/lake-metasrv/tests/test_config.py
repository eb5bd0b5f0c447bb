"""MetaConfig: every value validated before any storage opens."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lake_core.errors import ConfigError
from lake_metasrv.config import MetaConfig


def test_defaults(tmp_path: Path) -> None:
    config = MetaConfig.load(data_dir=tmp_path / "d", env={})
    assert config.retain_versions == 10
    assert config.operation_retention_secs == 604_800
    assert config.shutdown_grace_ms == 30_000
    assert not config.faults.armed
    assert config.addr == "127.0.0.1:50052"
    assert not (tmp_path / "d").exists(), "parsing must not create the data dir"


@pytest.mark.parametrize("value", ["1", "10000", " 42 "])
def test_retain_versions_in_range(tmp_path: Path, value: str) -> None:
    config = MetaConfig.load(data_dir=tmp_path, env={"LAKE_LANCE_RETAIN_VERSIONS": value})
    assert config.retain_versions == int(value)


@pytest.mark.parametrize("value", ["0", "10001", "-1", "ten", "1.5", "0x10"])
def test_bad_retain_versions_names_the_variable(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="LAKE_LANCE_RETAIN_VERSIONS"):
        MetaConfig.load(data_dir=tmp_path, env={"LAKE_LANCE_RETAIN_VERSIONS": value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LAKE_APPEND_OPERATION_RETENTION_SECS", "0"),
        ("LAKE_APPEND_OPERATION_RETENTION_SECS", "week"),
        ("LAKE_SHUTDOWN_GRACE_MS", "0"),
        ("LAKE_SHUTDOWN_GRACE_MS", "-5"),
    ],
)
def test_other_bad_values(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        MetaConfig.load(data_dir=tmp_path, env={name: value})


def test_crash_points_come_only_from_lake_faults(tmp_path: Path) -> None:
    # The old per-hook variables arm nothing.
    env = {"LAKE_TEST_HOOKS": "1", "LAKE_TEST_CRASH_POINT": "after_lance_commit"}
    assert not MetaConfig.load(data_dir=tmp_path, env=env).faults.armed
    hooked = MetaConfig.load(data_dir=tmp_path, env={"LAKE_FAULTS": "meta.after_lance_commit"})
    assert hooked.faults.points == {"meta.after_lance_commit"}
    with pytest.raises(ConfigError, match="LAKE_FAULTS"):
        MetaConfig.load(data_dir=tmp_path, env={"LAKE_FAULTS": "meta.nowhere"})


@pytest.mark.parametrize("addr", ["0.0.0.0:50052", "10.1.2.3:1", "nohost", "127.0.0.1:x"])
def test_addr_must_be_loopback_host_port(tmp_path: Path, addr: str) -> None:
    with pytest.raises(ConfigError, match="--addr"):
        MetaConfig.load(data_dir=tmp_path, addr=addr, env={})


def test_data_dir_must_not_be_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="--data-dir"):
        MetaConfig.load(data_dir=tmp_path / "f", env={})


def test_bad_env_fails_startup_before_storage(tmp_path: Path) -> None:
    data_dir = tmp_path / "never-created"
    env = {**os.environ, "LAKE_LANCE_RETAIN_VERSIONS": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "lake_metasrv", "--addr", "127.0.0.1:0", "--data-dir", data_dir],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert b"LAKE_LANCE_RETAIN_VERSIONS" in proc.stderr
    assert not data_dir.exists()
