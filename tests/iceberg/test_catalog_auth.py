"""Bearer token, OAuth2 client credentials and mutual TLS over HTTPS, and their fatal failures.

A TLS-terminating, auth-checking front (tools/lake_testing/catalog_proxy.py)
stands before SeaweedFS's catalog, with a throwaway test CA.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lake_iceberg.errors import AuthFailed, ConfigInvalid, RegistrarError
from lake_iceberg.registrar.service import Registrar
from tests.iceberg.conftest import Lane, data_files, field
from tools.lake_testing.catalog_proxy import CatalogProxy
from tools.lake_testing.tls import ServerCert, TestCA, issue_client_cert

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

# Ids the catalog would not assign itself, so creation needs the exact-schema commit.
V1 = pa.schema([field("robot", pa.string(), 11), field("t", pa.int32(), 12)])
V2 = pa.schema(
    [field("robot", pa.string(), 11), field("t", pa.int64(), 12), field("x", pa.float64(), 14)]
)


@dataclass
class Pki:
    ca: TestCA
    server: ServerCert
    client: ServerCert
    foreign_ca: TestCA
    foreign_client: ServerCert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = TestCA(root / "ca")
    foreign = TestCA(root / "foreign", common_name="Foreign CA")
    return Pki(
        ca=ca,
        server=ca.issue("catalog.test"),
        client=issue_client_cert(ca, "registrar"),
        foreign_ca=foreign,
        foreign_client=issue_client_cert(foreign, "intruder"),
    )


@pytest.fixture
def front(lane: Lane, pki: Pki) -> Iterator[Any]:
    proxies: list[CatalogProxy] = []

    def start(**options: Any) -> CatalogProxy:
        proxy = CatalogProxy(
            lane.server.iceberg_endpoint, server_cert=pki.server, **options
        ).start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


def _auth(mode: str, lane: Lane, pki: Pki, proxy_uri: str) -> dict[str, Any]:
    s = lane.server
    if mode == "token":
        return {"catalog_token": s.token(), "catalog_credential": None}
    if mode == "credential":
        return {}
    assert mode == "mtls"
    return {
        "catalog_client_cert": str(pki.client.cert_file),
        "catalog_client_key": str(pki.client.key_file),
    }


def _front_options(mode: str, lane: Lane, pki: Pki) -> dict[str, Any]:
    if mode == "token":
        return {"require_token": lane.server.token()}
    if mode == "credential":
        return {"require_issued_token": True}
    return {"client_ca": pki.ca.cert_file}


@pytest.mark.parametrize("mode", ["token", "credential", "mtls"])
def test_https_catalog_registers_and_evolves(mode: str, lane: Lane, pki: Pki, front: Any) -> None:
    proxy = front(**_front_options(mode, lane, pki))
    config = lane.config(
        catalog_uri=proxy.endpoint,
        catalog_ca_file=str(pki.ca.cert_file),
        **_auth(mode, lane, pki, proxy.endpoint),
    )
    lane.write("pose", "000001", V1, {"robot": ["a"], "t": [1]})
    lane.write("pose", "000002", V2, {"robot": ["b"], "t": [2**40], "x": [0.5]})
    lane.ship()
    assert Registrar(config).run_once().registered == 2
    # Creation, the exact-schema commit, the evolution commit and both appends went through the front.
    assert proxy.requests["commit"] == 4
    if mode == "credential":
        assert proxy.requests["token"] >= 1
    table = lane.table("pose")
    assert [(f.field_id, f.name, str(f.field_type)) for f in table.schema().fields] == [
        (11, "robot", "string"),
        (12, "t", "long"),
        (14, "x", "double"),
    ]
    assert len(data_files(table)) == 2


def _failing_config(case: str, lane: Lane, pki: Pki, front: Any) -> tuple[Any, Any]:
    if case == "wrong_token":
        proxy = front(require_token=lane.server.token())
        return proxy, lane.config(
            catalog_uri=proxy.endpoint,
            catalog_ca_file=str(pki.ca.cert_file),
            catalog_token="not-the-token",
            catalog_credential=None,
        )
    if case == "token_endpoint_401":
        proxy = front(require_issued_token=True, token_status=401)
        return proxy, lane.config(catalog_uri=proxy.endpoint, catalog_ca_file=str(pki.ca.cert_file))
    if case in ("no_client_cert", "foreign_client_cert"):
        proxy = front(client_ca=pki.ca.cert_file)
        extra = {}
        if case == "foreign_client_cert":
            extra = {
                "catalog_client_cert": str(pki.foreign_client.cert_file),
                "catalog_client_key": str(pki.foreign_client.key_file),
            }
        return proxy, lane.config(
            catalog_uri=proxy.endpoint, catalog_ca_file=str(pki.ca.cert_file), **extra
        )
    proxy = front()
    ca = {"foreign_ca": str(pki.foreign_ca.cert_file), "platform_roots": None}[case]
    return proxy, lane.config(catalog_uri=proxy.endpoint, catalog_ca_file=ca)


@pytest.mark.parametrize(
    ("case", "error", "needle"),
    [
        ("wrong_token", AuthFailed, "auth.failed"),
        ("token_endpoint_401", AuthFailed, "auth.failed"),
        ("no_client_cert", AuthFailed, "client certificate"),
        ("foreign_client_cert", AuthFailed, "client certificate"),
        ("foreign_ca", ConfigInvalid, "not trusted"),
        ("platform_roots", ConfigInvalid, "not trusted"),
    ],
)
def test_rejected_credentials_are_fatal_and_register_nothing(
    case: str, error: type[RegistrarError], needle: str, lane: Lane, pki: Pki, front: Any
) -> None:
    lane.write("pose", "000001", V1, {"robot": ["a"], "t": [1]})
    lane.ship()
    proxy, config = _failing_config(case, lane, pki, front)
    sleeps: list[float] = []
    with pytest.raises(error) as caught:
        Registrar(config, sleep=sleeps.append).run_once()
    assert needle in str(caught.value)
    assert sleeps == []  # fatal at once, never retried with backoff
    assert lane.server.secret_key not in str(caught.value)
    assert proxy.requests["commit"] == 0
    assert not lane.table_exists("pose")


def test_ca_file_without_certificate_fails_at_startup(lane: Lane, tmp_path: Path) -> None:
    bogus = tmp_path / "empty.pem"
    bogus.write_text("no certificate here\n")
    with pytest.raises(ConfigInvalid, match="catalog_ca_file"):
        lane.config(catalog_uri="https://127.0.0.1:1", catalog_ca_file=str(bogus))


def test_credential_401_re_exchanges_once_and_retries(lane: Lane, pki: Pki, front: Any) -> None:
    proxy = front(require_issued_token=True)
    config = lane.config(catalog_uri=proxy.endpoint, catalog_ca_file=str(pki.ca.cert_file))
    lane.write("pose", "000001", V1, {"robot": ["a"], "t": [1]})
    lane.ship()
    sleeps: list[float] = []
    registrar = Registrar(config, sleep=sleeps.append)
    registrar.catalog()
    exchanges = proxy.requests["token"]
    proxy.expire_tokens = 1
    assert registrar.run_once().registered == 1
    assert proxy.requests["token"] == exchanges + 1
    assert sleeps == []  # retried at once, not through the backoff
