"""QueryConfig: everything validated before a listener binds."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from lake_core.errors import ConfigError
from lake_query.config import QueryConfig


def key_ring(path: Path, mode: int = 0o600) -> Path:
    key = base64.b64encode(os.urandom(32)).decode()
    path.write_text(json.dumps({"active": "k1", "keys": [{"id": "k1", "key": key}]}))
    path.chmod(mode)
    return path


def test_defaults_on_loopback_use_an_ephemeral_key() -> None:
    config = QueryConfig.load("127.0.0.1:50051", "http://127.0.0.1:50052", env={})
    assert config.ticket_ring.active_id == "ephemeral"
    assert config.ticket_ttl_secs == 300
    assert config.catalog_refresh_ms == 1000
    assert config.audience == "lake-query"
    assert config.loopback


def test_environment_overrides(tmp_path: Path) -> None:
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(key_ring(tmp_path / "keys.json")),
        "LAKE_QUERY_TICKET_TTL_SECS": "60",
        "LAKE_QUERY_CATALOG_REFRESH_MS": "250",
        "LAKE_QUERY_TICKET_AUDIENCE": "fleet-a",
    }
    config = QueryConfig.load("localhost:7000", "https://meta.internal:50052/", env=env)
    assert config.ticket_ring.active_id == "k1"
    assert (config.ticket_ttl_secs, config.catalog_refresh_ms) == (60, 250)
    assert config.audience == "fleet-a"
    assert config.metadata_addr == "https://meta.internal:50052"
    secret = json.loads(Path(env["LAKE_QUERY_TICKET_KEYS_FILE"]).read_text())["keys"][0]["key"]
    assert secret not in repr(config)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LAKE_QUERY_TICKET_TTL_SECS": "0"}, "LAKE_QUERY_TICKET_TTL_SECS"),
        ({"LAKE_QUERY_TICKET_TTL_SECS": "3601"}, "LAKE_QUERY_TICKET_TTL_SECS"),
        ({"LAKE_QUERY_TICKET_TTL_SECS": "five"}, "LAKE_QUERY_TICKET_TTL_SECS"),
        ({"LAKE_QUERY_CATALOG_REFRESH_MS": "0"}, "LAKE_QUERY_CATALOG_REFRESH_MS"),
        ({"LAKE_QUERY_TICKET_AUDIENCE": "has space"}, "LAKE_QUERY_TICKET_AUDIENCE"),
        ({"LAKE_QUERY_TICKET_KEYS_FILE": "/nonexistent/keys.json"}, "LAKE_QUERY_TICKET_KEYS_FILE"),
    ],
)
def test_bad_values_name_their_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        QueryConfig.load("127.0.0.1:50051", "http://127.0.0.1:50052", env=env)


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    env = {"LAKE_QUERY_TICKET_KEYS_FILE": str(key_ring(tmp_path / "keys.json", 0o644))}
    with pytest.raises(ConfigError, match="chmod 600"):
        QueryConfig.load("127.0.0.1:50051", "http://127.0.0.1:50052", env=env)


@pytest.mark.parametrize("addr", ["50051", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", ""])
def test_bad_listen_addresses(addr: str) -> None:
    with pytest.raises(ConfigError, match="--addr"):
        QueryConfig.load(addr, "http://127.0.0.1:50052", env={})


@pytest.mark.parametrize("addr", ["127.0.0.1:50052", "ftp://x:1", "http://", "http://host"])
def test_bad_metadata_addresses(addr: str) -> None:
    with pytest.raises(ConfigError, match="--metadata-addr"):
        QueryConfig.load("127.0.0.1:50051", addr, env={})


def test_non_loopback_listener_is_refused(tmp_path: Path) -> None:
    env = {"LAKE_QUERY_TICKET_KEYS_FILE": str(key_ring(tmp_path / "keys.json"))}
    with pytest.raises(ConfigError, match="loopback"):
        QueryConfig.load("0.0.0.0:50051", "http://127.0.0.1:50052", env=env)
