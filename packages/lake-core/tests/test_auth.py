"""Principal maps, token files, delegation, TLS material and the listener policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lake_core.auth import (
    ADMIN_PRINCIPAL,
    ON_BEHALF_OF_HEADER,
    Authenticator,
    PrincipalMap,
    Secret,
    decode_on_behalf_of,
    encode_on_behalf_of,
    read_token_file,
)
from lake_core.errors import ConfigError, PermissionDenied, Unauthenticated
from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_core.security import ServerSecurity, check_internal_client
from lake_core.tls import ClientTLS, load_client_tls, load_server_tls

ALICE_TOKEN = "alice-token-0123456789abcdef"
QUERY_TOKEN = "query-service-token-0123456789"
ALICE = Principal(
    principal_id="alice", tenant_id="acme", role="user", namespaces=frozenset({"ops", "lab"})
)


def write_map(path: Path, bindings: list[dict[str, Any]], mode: int = 0o600) -> Path:
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(mode)
    return path


def binding(token: str, pid: str, tenant: str, role: str, namespaces: Any = None) -> dict[str, Any]:
    entry = {"token": token, "principal_id": pid, "tenant_id": tenant, "role": role}
    if namespaces is not None:
        entry["namespaces"] = namespaces
    return entry


@pytest.fixture
def principals(tmp_path: Path) -> PrincipalMap:
    return PrincipalMap.from_file(
        write_map(
            tmp_path / "p.json",
            [
                binding(ALICE_TOKEN, "alice", "acme", "user", ["ops", "lab"]),
                binding(QUERY_TOKEN, "query", "lake", "query_service", ["ops", "fleet"]),
                binding("admin-token-0123456789abcdef", "root", "lake", "admin", "*"),
            ],
        )
    )


def bearer(token: str) -> dict[str, str | bytes]:
    return {"authorization": f"Bearer {token}"}


def test_map_authenticates_each_binding(principals: PrincipalMap) -> None:
    auth = Authenticator(principals)
    assert auth.authenticate(bearer(ALICE_TOKEN)) == ALICE
    assert auth.authenticate({"authorization": b"bearer " + QUERY_TOKEN.encode()}).role == (
        "query_service"
    )
    admin = auth.authenticate(bearer("admin-token-0123456789abcdef"))
    assert admin.role == "admin"
    assert admin.namespaces is None
    assert ALICE_TOKEN not in repr(principals)
    assert ALICE_TOKEN not in repr(auth)


@pytest.mark.parametrize(
    "metadata",
    [{}, bearer("not-a-bound-token-at-all"), {"authorization": f"Basic {ALICE_TOKEN}"}],
)
def test_missing_or_wrong_credentials_are_unauthenticated(
    principals: PrincipalMap, metadata: dict[str, str | bytes]
) -> None:
    with pytest.raises(Unauthenticated) as caught:
        Authenticator(principals).authenticate(metadata)
    assert ALICE_TOKEN not in str(caught.value)


def test_development_mode_is_the_dev_principal_whatever_is_sent() -> None:
    auth = Authenticator(None)
    assert auth.development
    assert auth.authenticate({}) == DEV_PRINCIPAL
    assert auth.authenticate(bearer("anything-at-all-0123456")) == DEV_PRINCIPAL


def test_single_admin_token() -> None:
    auth = Authenticator.single_admin(Secret("the-admin-token-0123456789"))
    assert auth.authenticate(bearer("the-admin-token-0123456789")) == ADMIN_PRINCIPAL
    with pytest.raises(Unauthenticated):
        auth.authenticate(bearer("the-admin-token-012345678X"))


def test_delegation_intersects_grants_and_is_never_admin(principals: PrincipalMap) -> None:
    auth = Authenticator(principals, delegation=True)
    metadata = {**bearer(QUERY_TOKEN), ON_BEHALF_OF_HEADER: encode_on_behalf_of(ALICE)}
    effective = auth.authenticate(metadata)
    assert (effective.principal_id, effective.tenant_id, effective.role) == (
        "alice",
        "acme",
        "user",
    )
    assert effective.namespaces == frozenset({"ops"})  # {ops, lab} & {ops, fleet}
    boss = Principal(principal_id="boss", tenant_id="acme", role="admin")
    as_boss = auth.authenticate(
        {**bearer(QUERY_TOKEN), ON_BEHALF_OF_HEADER: encode_on_behalf_of(boss)}
    )
    assert as_boss.role == "user"
    assert as_boss.namespaces == frozenset({"ops", "fleet"})


def test_only_service_roles_may_delegate(principals: PrincipalMap) -> None:
    auth = Authenticator(principals, delegation=True)
    other = Principal(principal_id="bob", tenant_id="globex", role="user", namespaces=None)
    with pytest.raises(PermissionDenied):
        auth.authenticate({**bearer(ALICE_TOKEN), ON_BEHALF_OF_HEADER: encode_on_behalf_of(other)})
    with pytest.raises(Unauthenticated):
        auth.authenticate({**bearer(QUERY_TOKEN), ON_BEHALF_OF_HEADER: "!!not-base64!!"})
    # Without delegation (Query), the header changes nothing.
    plain = Authenticator(principals)
    assert (
        plain.authenticate({**bearer(ALICE_TOKEN), ON_BEHALF_OF_HEADER: encode_on_behalf_of(other)})
        == ALICE
    )


def test_on_behalf_of_round_trip() -> None:
    assert decode_on_behalf_of(encode_on_behalf_of(ALICE)) == ALICE
    assert decode_on_behalf_of(encode_on_behalf_of(DEV_PRINCIPAL)) == DEV_PRINCIPAL


@pytest.mark.parametrize(
    ("bindings", "message"),
    [
        ([binding("short", "a", "t", "user", ["x"])], "16-4096"),
        ([binding(ALICE_TOKEN, "a", "t", "superuser", ["x"])], "role"),
        ([binding(ALICE_TOKEN, "a", "t", "user")], "namespaces"),
        ([binding(ALICE_TOKEN, "a b", "t", "user", ["x"])], "principal_id"),
        (
            [
                binding(ALICE_TOKEN, "a", "t", "user", ["x"]),
                binding(ALICE_TOKEN, "b", "t", "admin"),
            ],
            "duplicate token",
        ),
        ([], "binding"),
    ],
)
def test_bad_maps_fail_without_echoing_tokens(
    tmp_path: Path, bindings: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        PrincipalMap.from_file(write_map(tmp_path / "p.json", bindings))
    assert ALICE_TOKEN not in str(caught.value)
    assert "LAKE_AUTH_PRINCIPALS_FILE" in str(caught.value)


def test_map_readable_by_others_names_the_file_and_the_fix(tmp_path: Path) -> None:
    path = write_map(tmp_path / "p.json", [binding(ALICE_TOKEN, "a", "t", "admin")], 0o644)
    with pytest.raises(ConfigError, match="chmod 600") as caught:
        PrincipalMap.from_file(path)
    assert str(path) in str(caught.value)


def test_token_files(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {ALICE_TOKEN}\n")
    path.chmod(0o600)
    secret = read_token_file(path, "LAKE_METADATA_AUTH_TOKEN_FILE")
    assert secret.reveal() == ALICE_TOKEN
    assert ALICE_TOKEN not in repr(secret)
    assert ALICE_TOKEN not in str(secret)
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="LAKE_METADATA_AUTH_TOKEN_FILE"):
        read_token_file(path, "LAKE_METADATA_AUTH_TOKEN_FILE")


# -- TLS and the listener policy ------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> Any:
    from tools.lake_testing.tls import TestCA

    ca = TestCA(tmp_path / "pki")
    return ca, ca.issue("lake.test"), ca.issue("other.test")


def test_server_tls_pair_is_loaded_and_matched(pki: Any) -> None:
    _, cert, other = pki
    tls = load_server_tls(cert.env())
    assert tls is not None
    assert b"BEGIN CERTIFICATE" in tls.cert_pem
    assert "PRIVATE" not in repr(tls)
    with pytest.raises(ConfigError, match="does not match"):
        load_server_tls(
            {"LAKE_TLS_CERT_FILE": str(cert.cert_file), "LAKE_TLS_KEY_FILE": str(other.key_file)}
        )


@pytest.mark.parametrize("present", ["LAKE_TLS_CERT_FILE", "LAKE_TLS_KEY_FILE"])
def test_partial_tls_is_refused(pki: Any, present: str) -> None:
    _, cert, _ = pki
    with pytest.raises(ConfigError, match="partial TLS configuration"):
        load_server_tls({present: cert.env()[present]})


def test_client_tls(pki: Any) -> None:
    ca, _, _ = pki
    tls = load_client_tls(
        {"LAKE_METADATA_CA_FILE": str(ca.cert_file), "LAKE_METADATA_SERVER_NAME": "meta.internal"},
        "LAKE_METADATA_CA_FILE",
        "LAKE_METADATA_SERVER_NAME",
    )
    assert tls.ca_pem == ca.cert_pem
    assert tls.server_name == "meta.internal"
    with pytest.raises(ConfigError, match="LAKE_PEER_SERVER_NAME"):
        load_client_tls(
            {"LAKE_PEER_SERVER_NAME": "bad name"}, "LAKE_PEER_CA_FILE", "LAKE_PEER_SERVER_NAME"
        )


def test_listener_policy(tmp_path: Path, pki: Any) -> None:
    _, cert, _ = pki
    token = tmp_path / "admin-token"
    token.write_text("deployment-admin-token-0123456789")
    token.chmod(0o600)
    auth = {"LAKE_AUTH_TOKEN_FILE": str(token)}

    assert ServerSecurity.load("127.0.0.1:1", {}).authenticator.development
    with pytest.raises(ConfigError, match="requires authentication"):
        ServerSecurity.load("0.0.0.0:1", {})
    with pytest.raises(ConfigError, match="requires TLS"):
        ServerSecurity.load("0.0.0.0:1", auth)
    insecure = ServerSecurity.load("0.0.0.0:1", {**auth, "LAKE_ALLOW_INSECURE": "true"})
    assert insecure.tls is None
    assert not insecure.authenticator.development
    with pytest.raises(ConfigError, match="requires authentication"):
        # Plaintext is allowed behind a mesh; anonymous access never is.
        ServerSecurity.load("0.0.0.0:1", {"LAKE_ALLOW_INSECURE": "true"})
    secure = ServerSecurity.load("0.0.0.0:1", {**auth, **cert.env()})
    assert secure.tls_pair is not None
    # Configured credentials apply on loopback too.
    assert not ServerSecurity.load("127.0.0.1:1", auth).authenticator.development
    with pytest.raises(ConfigError, match="mutually exclusive"):
        ServerSecurity.load("127.0.0.1:1", {**auth, "LAKE_AUTH_PRINCIPALS_FILE": str(token)})
    with pytest.raises(ConfigError, match="LAKE_ALLOW_INSECURE"):
        ServerSecurity.load("127.0.0.1:1", {"LAKE_ALLOW_INSECURE": "maybe"})


def test_internal_client_policy() -> None:
    kwargs: dict[str, Any] = {
        "url_flag": "--metadata-addr",
        "ca_variable": "LAKE_METADATA_CA_FILE",
        "name_variable": "LAKE_METADATA_SERVER_NAME",
    }
    check_internal_client("http://127.0.0.1:5", ClientTLS(), allow_insecure=False, **kwargs)
    check_internal_client("https://meta:5", ClientTLS(), allow_insecure=False, **kwargs)
    with pytest.raises(ConfigError, match="plaintext to a non-loopback host"):
        check_internal_client("http://meta:5", ClientTLS(), allow_insecure=False, **kwargs)
    check_internal_client("http://meta:5", ClientTLS(), allow_insecure=True, **kwargs)
    with pytest.raises(ConfigError, match="https://"):
        check_internal_client(
            "http://127.0.0.1:5", ClientTLS(server_name="m"), allow_insecure=True, **kwargs
        )
