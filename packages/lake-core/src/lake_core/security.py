"""The listener security policy both services apply before binding.

- Credentials: ``LAKE_AUTH_PRINCIPALS_FILE`` or ``LAKE_AUTH_TOKEN_FILE``
  (never both). With neither, the listener runs in development mode, which is
  allowed only on a loopback address: every caller is the DEV principal.
- TLS: ``LAKE_TLS_CERT_FILE`` and ``LAKE_TLS_KEY_FILE`` together.
- A non-loopback listener needs credentials, and TLS unless
  ``LAKE_ALLOW_INSECURE=true`` (plaintext behind a trusted TLS-terminating
  mesh; bearer authentication stays mandatory).
- Configured credentials apply on loopback too: there is no bypass.

Internal clients (Query→Metasrv, follower→leader) follow the same rule:
plaintext only to a loopback host or with ``LAKE_ALLOW_INSECURE=true``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lake_core.auth import (
    AUTH_PRINCIPALS_FILE,
    AUTH_TOKEN_FILE,
    Authenticator,
    PrincipalMap,
    Secret,
    read_token_file,
)
from lake_core.config import ALLOW_INSECURE, is_loopback_address
from lake_core.endpoints import parse_endpoint
from lake_core.errors import ConfigError
from lake_core.tls import TLS_CERT_FILE, TLS_KEY_FILE, ClientTLS, ServerTLS, load_server_tls

__all__ = [
    "ALLOW_INSECURE",
    "ServerSecurity",
    "check_internal_client",
    "env_bool",
    "optional_token",
]


def env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise ConfigError(f"{name} must be true or false, got {raw[:20]!r}")


def optional_token(env: Mapping[str, str], variable: str) -> Secret | None:
    path = (env.get(variable) or "").strip()
    return read_token_file(path, variable) if path else None


def _authenticator(env: Mapping[str, str], delegation: bool) -> Authenticator:
    principals_file = (env.get(AUTH_PRINCIPALS_FILE) or "").strip()
    token_file = (env.get(AUTH_TOKEN_FILE) or "").strip()
    if principals_file and token_file:
        raise ConfigError(
            f"{AUTH_PRINCIPALS_FILE} and {AUTH_TOKEN_FILE} are mutually exclusive: "
            "put the admin credential into the principal map as an admin binding"
        )
    if principals_file:
        principals = PrincipalMap.from_file(principals_file, AUTH_PRINCIPALS_FILE)
        return Authenticator(principals, delegation=delegation)
    if token_file:
        token = read_token_file(token_file, AUTH_TOKEN_FILE)
        return Authenticator.single_admin(token, delegation=delegation)
    return Authenticator(None, delegation=delegation)


@dataclass(frozen=True)
class ServerSecurity:
    """How one listener authenticates callers and whether it serves TLS."""

    authenticator: Authenticator
    tls: ServerTLS | None = None
    allow_insecure: bool = False

    @property
    def tls_pair(self) -> tuple[bytes, bytes] | None:
        return None if self.tls is None else self.tls.pair()

    @classmethod
    def load(
        cls,
        addr: str,
        env: Mapping[str, str],
        *,
        delegation: bool = False,
        addr_flag: str = "--addr",
    ) -> ServerSecurity:
        """Apply the policy to listen address ``addr``; raise ConfigError naming the fix."""
        authenticator = _authenticator(env, delegation)
        tls = load_server_tls(env)
        allow_insecure = env_bool(env, ALLOW_INSECURE)
        if not is_loopback_address(addr):
            if authenticator.development:
                raise ConfigError(
                    f"{addr_flag} {addr} is not a loopback address: a non-loopback listener "
                    f"requires authentication; set {AUTH_PRINCIPALS_FILE} (or {AUTH_TOKEN_FILE})"
                )
            if tls is None and not allow_insecure:
                raise ConfigError(
                    f"{addr_flag} {addr} is not a loopback address: a non-loopback listener "
                    f"requires TLS; set {TLS_CERT_FILE} and {TLS_KEY_FILE} (or "
                    f"{ALLOW_INSECURE}=true behind a trusted TLS-terminating mesh)"
                )
        return cls(authenticator=authenticator, tls=tls, allow_insecure=allow_insecure)


def check_internal_client(
    url: str,
    tls: ClientTLS,
    *,
    allow_insecure: bool,
    url_flag: str,
    ca_variable: str,
    name_variable: str,
) -> None:
    """Refuse plaintext to a remote server (unless allowed) and CA settings on plaintext."""
    endpoint = parse_endpoint(url)
    if endpoint is None or endpoint.tls:
        return
    if tls.configured:
        raise ConfigError(
            f"{ca_variable}/{name_variable} are set but {url_flag} {url} is plaintext; "
            "use an https:// URL"
        )
    if not is_loopback_address(endpoint.target) and not allow_insecure:
        raise ConfigError(
            f"{url_flag} {url} is plaintext to a non-loopback host; use https:// "
            f"(or {ALLOW_INSECURE}=true behind a trusted TLS-terminating mesh)"
        )
