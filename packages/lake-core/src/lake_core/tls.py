"""TLS material for Lake servers and their internal clients, validated at startup.

Servers: ``LAKE_TLS_CERT_FILE`` (PEM chain) and ``LAKE_TLS_KEY_FILE`` (PEM
private key, a 0600 file) together, or neither: one without the other is a
startup error. The pair is parsed and matched before anything binds.

Internal clients verify their server against a CA bundle and, optionally, an
expected server name (when the certificate names a DNS name other than the
address dialled): Query→Metasrv with ``LAKE_METADATA_CA_FILE`` and
``LAKE_METADATA_SERVER_NAME``, follower→leader with ``LAKE_PEER_CA_FILE`` and
``LAKE_PEER_SERVER_NAME``.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lake_core.config import (
    METADATA_CA_FILE,
    METADATA_SERVER_NAME,
    PEER_CA_FILE,
    PEER_SERVER_NAME,
    TLS_CERT_FILE,
    TLS_KEY_FILE,
)
from lake_core.errors import ConfigError
from lake_core.private_file import check_private_file

if TYPE_CHECKING:
    from cryptography import x509

__all__ = [
    "METADATA_CA_FILE",
    "METADATA_SERVER_NAME",
    "PEER_CA_FILE",
    "PEER_SERVER_NAME",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "ClientTLS",
    "ServerTLS",
    "load_client_tls",
    "load_server_tls",
]


_SERVER_NAME = re.compile(r"[A-Za-z0-9.-]{1,253}|[0-9A-Fa-f:.]{2,45}")


def _read(path: Path, variable: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path}: {exc.strerror}") from None


def _certificates(pem: bytes, variable: str, path: Path) -> list[x509.Certificate]:
    # Servers only (lake-core[server]): clients check CA bundles with the stdlib (_check_ca).
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError(f"{variable}: {path} holds no PEM certificate")
    return certs


def _check_ca(pem: bytes, variable: str, path: Path) -> None:
    """A CA bundle OpenSSL can load: the stdlib check, so clients need no cryptography."""
    try:
        if not pem.strip():
            raise ValueError("empty")
        ssl.create_default_context(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise ConfigError(f"{variable}: {path} holds no PEM certificate") from None


@dataclass(frozen=True, repr=False)
class ServerTLS:
    """A server's certificate chain and private key (PEM bytes)."""

    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:
        return "ServerTLS(cert_pem=<...>, key_pem=<redacted>)"

    def pair(self) -> tuple[bytes, bytes]:
        """``(cert_pem, key_pem)`` as :func:`lake_core.flight.server.serve` takes it."""
        return self.cert_pem, self.key_pem


@dataclass(frozen=True)
class ClientTLS:
    """How an internal client verifies its server (CA bundle and expected name)."""

    ca_pem: bytes | None = None
    server_name: str | None = None

    def __repr__(self) -> str:
        ca = "<pem>" if self.ca_pem else None
        return f"ClientTLS(ca_pem={ca}, server_name={self.server_name!r})"

    @property
    def configured(self) -> bool:
        return self.ca_pem is not None or self.server_name is not None


def _value(env: Mapping[str, str], name: str) -> str:
    return (env.get(name) or "").strip()


def load_server_tls(env: Mapping[str, str]) -> ServerTLS | None:
    """The server's TLS pair, or None when neither variable is set."""
    cert_file, key_file = _value(env, TLS_CERT_FILE), _value(env, TLS_KEY_FILE)
    if not cert_file and not key_file:
        return None
    if not cert_file or not key_file:
        missing = TLS_KEY_FILE if cert_file else TLS_CERT_FILE
        present = TLS_CERT_FILE if cert_file else TLS_KEY_FILE
        raise ConfigError(
            f"partial TLS configuration: {present} is set but {missing} is not; "
            f"set both {TLS_CERT_FILE} and {TLS_KEY_FILE}, or neither"
        )
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = Path(cert_file), Path(key_file)
    cert_pem = _read(cert_path, TLS_CERT_FILE)
    leaf = _certificates(cert_pem, TLS_CERT_FILE, cert_path)[0]
    check_private_file(key_path, TLS_KEY_FILE)
    key_pem = _read(key_path, TLS_KEY_FILE)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{TLS_KEY_FILE}: {key_path} is not an unencrypted PEM private key"
        ) from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if key.public_key().public_bytes(encoding, public) != leaf.public_key().public_bytes(
        encoding, public
    ):
        raise ConfigError(
            f"{TLS_KEY_FILE} ({key_path}) does not match the certificate in "
            f"{TLS_CERT_FILE} ({cert_path})"
        )
    return ServerTLS(cert_pem=cert_pem, key_pem=key_pem)


def load_client_tls(env: Mapping[str, str], ca_variable: str, name_variable: str) -> ClientTLS:
    """A CA bundle and expected server name from two variables (each optional)."""
    ca_file, name = _value(env, ca_variable), _value(env, name_variable)
    ca_pem = None
    if ca_file:
        path = Path(ca_file)
        ca_pem = _read(path, ca_variable)
        _check_ca(ca_pem, ca_variable, path)
    if name and not _SERVER_NAME.fullmatch(name):
        raise ConfigError(f"{name_variable} must be a DNS name or IP address, got {name[:80]!r}")
    return ClientTLS(ca_pem=ca_pem, server_name=name or None)
