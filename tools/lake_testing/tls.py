"""Throwaway TLS material for tests: a CA and server certificates it signs."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ServerCert", "TestCA", "issue_client_cert"]

_PRIVATE = serialization.PrivateFormat.PKCS8
_PEM = serialization.Encoding.PEM


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True)
class ServerCert:
    """A server certificate and key, written as ``LAKE_TLS_*`` files expect them."""

    cert_file: Path
    key_file: Path
    server_name: str

    def env(self) -> dict[str, str]:
        return {"LAKE_TLS_CERT_FILE": str(self.cert_file), "LAKE_TLS_KEY_FILE": str(self.key_file)}


class TestCA:
    """A self-signed CA, valid for one day, that issues server certificates."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, common_name: str = "Lake Test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert_pem = self._cert.public_bytes(_PEM)
        self.cert_file = directory / "ca.crt"
        self.cert_file.write_bytes(self.cert_pem)

    def issue(
        self,
        name: str,
        *,
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = ("127.0.0.1",),
    ) -> ServerCert:
        """A server certificate for ``name`` (a DNS SAN) plus the given extra SANs."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in (name, *dns_names)]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        cert_file = self.directory / f"{name}.crt"
        key_file = self.directory / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(_PEM) + self.cert_pem)
        key_file.write_bytes(key.private_bytes(_PEM, _PRIVATE, serialization.NoEncryption()))
        key_file.chmod(0o600)
        return ServerCert(cert_file=cert_file, key_file=key_file, server_name=name)


def issue_client_cert(ca: TestCA, name: str) -> ServerCert:
    """A client certificate (clientAuth) for mutual TLS, signed by ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca._cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca._key, hashes.SHA256())
    )
    cert_file = ca.directory / f"{name}.client.crt"
    key_file = ca.directory / f"{name}.client.key"
    cert_file.write_bytes(cert.public_bytes(_PEM) + ca.cert_pem)
    key_file.write_bytes(key.private_bytes(_PEM, _PRIVATE, serialization.NoEncryption()))
    key_file.chmod(0o600)
    return ServerCert(cert_file=cert_file, key_file=key_file, server_name=name)
