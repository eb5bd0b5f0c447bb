"""The connection builder: immutable, validated, and never showing the token."""

from __future__ import annotations

import pytest

import lake_sdk
from lake_core.errors import InvalidArgument
from lake_sdk._builder import ConnectOptions

TOKEN = "lk_super-secret-token-value-0123456789"
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_builders_are_immutable_and_redacted() -> None:
    base = lake_sdk.LakeClient.builder("https://query.internal:50051")
    built = (
        base.with_bearer_token(TOKEN).with_ca_certificate_pem(PEM).with_server_name("q.internal")
    )
    assert "***" in repr(built)
    assert TOKEN not in repr(built)
    assert "bearer_token=None" in repr(base)  # the original is unchanged
    sync = lake_sdk.Client.builder("https://query.internal:50051").with_bearer_token(TOKEN)
    assert TOKEN not in repr(sync)
    assert TOKEN not in repr(ConnectOptions())


@pytest.mark.parametrize("bad", ["", "has space", "tab\there", "é" * 20])
def test_bad_tokens_are_refused_without_being_echoed(bad: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        lake_sdk.LakeClient.builder("https://q:1").with_bearer_token(bad)
    assert bad not in str(caught.value) or not bad


def test_tls_settings_need_a_tls_endpoint() -> None:
    builder = lake_sdk.Client.builder("grpc://127.0.0.1:1").with_ca_certificate_pem(PEM)
    with pytest.raises(InvalidArgument, match="https://"):
        builder.connect()
    with pytest.raises(InvalidArgument, match="PEM"):
        lake_sdk.Client.builder("https://q:1").with_ca_certificate_pem(b"not a certificate")
    with pytest.raises(InvalidArgument, match="server name"):
        lake_sdk.Client.builder("https://q:1").with_server_name("bad name")
    with pytest.raises(InvalidArgument, match="with_\\*"):
        lake_sdk.Client.builder("https://q:1").with_options(options=None)
