"""Unsafe configurations refuse to start, with a message that names the fix.

These processes are asked to listen on 0.0.0.0 (or to read a bad file) and
must exit during configuration, before any listener binds or any storage
is created.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.cluster import principals_file, token
from tools.lake_testing.servers import free_port
from tools.lake_testing.tls import TestCA


def run(service: str, addr: str, env: dict[str, str], data_dir: Path) -> tuple[int, str]:
    if service == "meta":
        args = ["-m", "lake_metasrv", "--addr", addr, "--data-dir", str(data_dir)]
    else:
        args = ["-m", "lake_query", "--addr", addr, "--metadata-addr", "http://127.0.0.1:1"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    proc = subprocess.run(
        [sys.executable, *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("pki"))


def bindings() -> list[dict[str, object]]:
    return [{"token": token(), "principal_id": "ops", "tenant_id": "lake", "role": "admin"}]


@pytest.mark.parametrize("service", ["meta", "query"])
def test_a_principals_file_readable_by_others(tmp_path: Path, service: str) -> None:
    path = principals_file(tmp_path / "principals.json", bindings(), mode=0o644)
    env = {"LAKE_AUTH_PRINCIPALS_FILE": str(path)}
    code, output = run(service, f"127.0.0.1:{free_port()}", env, tmp_path / "data")
    assert code != 0
    assert "LAKE_AUTH_PRINCIPALS_FILE" in output
    assert str(path) in output
    assert f"chmod 600 {path}" in output
    assert "listening" not in output
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("service", ["meta", "query"])
@pytest.mark.parametrize("present", ["LAKE_TLS_CERT_FILE", "LAKE_TLS_KEY_FILE"])
def test_a_partial_tls_configuration(
    tmp_path: Path, pki: TestCA, service: str, present: str
) -> None:
    cert = pki.issue(f"{service}-{present.lower()}.test")
    missing = "LAKE_TLS_KEY_FILE" if present == "LAKE_TLS_CERT_FILE" else "LAKE_TLS_CERT_FILE"
    code, output = run(
        service, f"127.0.0.1:{free_port()}", {present: cert.env()[present]}, tmp_path
    )
    assert code != 0
    assert "partial TLS configuration" in output
    assert present in output
    assert missing in output
    assert "listening" not in output


@pytest.mark.parametrize("service", ["meta", "query"])
def test_a_non_loopback_listener_without_auth(tmp_path: Path, pki: TestCA, service: str) -> None:
    # TLS alone is not enough: anonymous access never leaves loopback.
    cert = pki.issue(f"{service}-noauth.test")
    code, output = run(service, f"0.0.0.0:{free_port()}", cert.env(), tmp_path / "data")
    assert code != 0
    assert "not a loopback address" in output
    assert "requires authentication" in output
    assert "LAKE_AUTH_PRINCIPALS_FILE" in output
    assert "listening" not in output
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("service", ["meta", "query"])
def test_a_non_loopback_listener_without_tls(tmp_path: Path, service: str) -> None:
    path = principals_file(tmp_path / "principals.json", bindings())
    env = {"LAKE_AUTH_PRINCIPALS_FILE": str(path)}
    code, output = run(service, f"0.0.0.0:{free_port()}", env, tmp_path / "data")
    assert code != 0
    assert "requires TLS" in output
    assert "LAKE_TLS_CERT_FILE" in output
    assert "LAKE_ALLOW_INSECURE" in output
    assert "listening" not in output
