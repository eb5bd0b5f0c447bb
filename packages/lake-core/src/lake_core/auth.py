"""Bearer authentication: the principal map, token files and delegation.

A server authenticates every RPC (gRPC Health included) with an
:class:`Authenticator`:

- **principal map** (``LAKE_AUTH_PRINCIPALS_FILE``): opaque bearer tokens
  bound to ``{principal_id, tenant_id, role, namespaces}``;
- **single admin token** (``LAKE_AUTH_TOKEN_FILE``): one deployment-admin
  credential, mutually exclusive with the map;
- **development**: no credentials configured, allowed only on a loopback
  listener (:mod:`lake_core.security` enforces that): every caller is
  :data:`~lake_core.principal.DEV_PRINCIPAL`.

Tokens are compared in constant time (SHA-256 digests, ``hmac.compare_digest``
against every binding, no early exit). They are held in :class:`Secret`
values whose ``repr`` is redacted, and no error message ever contains one.

Delegation: Query calls Metasrv with its own ``query_service`` credential and
names the end user in the :data:`ON_BEHALF_OF_HEADER` header. Metasrv honours
that header only from ``query_service``, ``metadata_peer`` or ``admin``
callers; the effective principal is the end user, as role ``user``, with the
intersection of both principals' namespace grants. A ``user`` that sends the
header is refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from lake_core.config import (
    AUTH_PRINCIPALS_FILE,
    AUTH_TOKEN_FILE,
    METADATA_AUTH_TOKEN_FILE,
    PEER_AUTH_TOKEN_FILE,
)
from lake_core.errors import ConfigError, InvalidArgument, PermissionDenied, Unauthenticated
from lake_core.principal import DEV_PRINCIPAL, Principal, Role
from lake_core.private_file import check_private_file

__all__ = [
    "ADMIN_PRINCIPAL",
    "AUTH_PRINCIPALS_FILE",
    "AUTH_TOKEN_FILE",
    "DELEGATING_ROLES",
    "METADATA_AUTH_TOKEN_FILE",
    "ON_BEHALF_OF_HEADER",
    "PEER_AUTH_TOKEN_FILE",
    "Authenticator",
    "PrincipalMap",
    "Secret",
    "bearer_metadata",
    "decode_on_behalf_of",
    "encode_on_behalf_of",
    "read_token_file",
]


#: gRPC metadata naming the end user a service calls on behalf of.
ON_BEHALF_OF_HEADER = "x-lake-on-behalf-of"
#: Roles whose calls may carry :data:`ON_BEHALF_OF_HEADER`.
DELEGATING_ROLES: frozenset[str] = frozenset({"query_service", "metadata_peer", "admin"})
#: Upper bound of the encoded header (the server accepts 64 KiB of metadata).
MAX_ON_BEHALF_OF_BYTES = 32 * 1024

#: The principal ``LAKE_AUTH_TOKEN_FILE`` authenticates.
ADMIN_PRINCIPAL = Principal(principal_id="deployment-admin", tenant_id="deployment", role="admin")

_ROLES: frozenset[str] = frozenset(get_args(Role))
# Visible ASCII without spaces: what an HTTP/2 header value can carry as-is.
_TOKEN = re.compile(r"[\x21-\x7e]{16,4096}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_MAP_SHAPE = (
    '{"bindings": [{"token": "...", "principal_id": "...", "tenant_id": "...", '
    '"role": "user|query_service|metadata_peer|admin", "namespaces": ["..."]}]}'
)


class Secret:
    """A credential whose ``repr``/``str`` never show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(
            self._value.encode(), other._value.encode()
        )

    def __hash__(self) -> int:
        return hash(_digest(self._value))

    def __reduce__(self) -> Any:
        # Keeps credentials out of pickles (multiprocessing, caches, crash dumps).
        raise TypeError("Secret values are not picklable")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: object) -> Secret:
        return self


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _check_token(token: str, where: str) -> str:
    if not _TOKEN.fullmatch(token):
        # Never echo the value: it may be a real credential with a typo.
        raise ConfigError(
            f"{where}: a token must be 16-4096 visible ASCII characters without spaces"
        )
    return token


def read_token_file(path: Path | str, variable: str) -> Secret:
    """Read one bearer token from a private (0600) file; surrounding whitespace is ignored."""
    file = Path(path)
    check_private_file(file, variable)
    try:
        text = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"{variable}: cannot read a UTF-8 token from {file}") from None
    return Secret(_check_token(text, f"{variable} ({file})"))


def bearer_metadata(token: Secret | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying ``token`` (empty without one)."""
    return (("authorization", f"Bearer {token.reveal()}"),) if token is not None else ()


def _namespaces(value: object, role: str, where: str) -> frozenset[str] | None:
    if value is None or value == "*":
        if role == "user":
            raise ConfigError(f"{where}: a user binding needs an explicit namespaces list")
        return None
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise ConfigError(f'{where}: namespaces must be a list of names (or "*" for all)')
    return frozenset(value)


def _binding(entry: object, index: int, variable: str, path: Path) -> tuple[str, Principal]:
    where = f"{variable} ({path}) binding {index}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be an object like {_MAP_SHAPE}")
    unknown = set(entry) - {"token", "principal_id", "tenant_id", "role", "namespaces"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    token = entry.get("token")
    if not isinstance(token, str):
        raise ConfigError(f"{where}: token must be a string")
    _check_token(token, where)
    role = entry.get("role")
    if role not in _ROLES:
        raise ConfigError(f"{where}: role must be one of {', '.join(sorted(_ROLES))}")
    ids = {}
    for key in ("principal_id", "tenant_id"):
        value = entry.get(key)
        if not isinstance(value, str) or not _ID.fullmatch(value):
            raise ConfigError(
                f"{where}: {key} must be 1-128 characters of letters, digits and '_.:@-'"
            )
        ids[key] = value
    principal = Principal(
        principal_id=ids["principal_id"],
        tenant_id=ids["tenant_id"],
        role=role,
        namespaces=_namespaces(entry.get("namespaces"), role, where),
    )
    return token, principal


@dataclass(frozen=True, repr=False)
class PrincipalMap:
    """Bearer token digests and the principals they authenticate (immutable)."""

    bindings: tuple[tuple[bytes, Principal], ...]

    def __repr__(self) -> str:
        return f"PrincipalMap({len(self.bindings)} bindings)"

    def __len__(self) -> int:
        return len(self.bindings)

    @classmethod
    def of(cls, tokens: Mapping[str, Principal]) -> PrincipalMap:
        return cls(tuple((_digest(t), p) for t, p in tokens.items()))

    @classmethod
    def from_file(cls, path: Path | str, variable: str = AUTH_PRINCIPALS_FILE) -> PrincipalMap:
        """Load and validate ``{"bindings": [...]}`` from a 0600 regular file."""
        file = Path(path)
        check_private_file(file, variable)
        try:
            doc = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            raise ConfigError(f"{variable}: {file} must be JSON {_MAP_SHAPE}") from None
        entries = doc.get("bindings") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{variable}: {file} must be JSON {_MAP_SHAPE} with a binding")
        seen: set[bytes] = set()
        bindings = []
        for index, entry in enumerate(entries):
            token, principal = _binding(entry, index, variable, file)
            digest = _digest(token)
            if digest in seen:
                raise ConfigError(f"{variable} ({file}) binding {index}: duplicate token")
            seen.add(digest)
            bindings.append((digest, principal))
        return cls(tuple(bindings))

    def lookup(self, token: str) -> Principal | None:
        """The principal bound to ``token``; timing does not depend on which one matches."""
        presented = _digest(token)
        found: Principal | None = None
        for digest, principal in self.bindings:
            if hmac.compare_digest(presented, digest):
                found = principal
        return found


def encode_on_behalf_of(principal: Principal) -> str:
    """The :data:`ON_BEHALF_OF_HEADER` value naming ``principal``."""
    doc = {
        "v": 1,
        "principal_id": principal.principal_id,
        "tenant_id": principal.tenant_id,
        "role": principal.role,
        "namespaces": None if principal.namespaces is None else sorted(principal.namespaces),
    }
    raw = json.dumps(doc, separators=(",", ":")).encode()
    value = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    if len(value) > MAX_ON_BEHALF_OF_BYTES:
        raise InvalidArgument(
            f"{principal.principal_id}'s namespace grants are too large to delegate "
            f"(over {MAX_ON_BEHALF_OF_BYTES} encoded bytes)"
        )
    return value


def decode_on_behalf_of(value: str | bytes) -> Principal:
    """Parse an :data:`ON_BEHALF_OF_HEADER` value, or raise Unauthenticated."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    try:
        if len(text) > MAX_ON_BEHALF_OF_BYTES:
            raise ValueError("too long")
        doc = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        if not isinstance(doc, dict) or doc.get("v") != 1:
            raise ValueError("version")
        namespaces = doc.get("namespaces")
        return Principal(
            principal_id=doc["principal_id"],
            tenant_id=doc["tenant_id"],
            role=doc["role"],
            namespaces=None if namespaces is None else frozenset(namespaces),
        )
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise Unauthenticated(f"malformed {ON_BEHALF_OF_HEADER} header") from None


def _delegate(caller: Principal, end_user: Principal) -> Principal:
    if caller.role not in DELEGATING_ROLES:
        raise PermissionDenied(f"a {caller.role} principal may not act on behalf of another")
    if caller.namespaces is None:
        granted = end_user.namespaces
    elif end_user.namespaces is None:
        granted = caller.namespaces
    else:
        granted = caller.namespaces & end_user.namespaces
    # Delegated calls are data-plane calls: never administrative.
    return Principal(
        principal_id=end_user.principal_id,
        tenant_id=end_user.tenant_id,
        role="user",
        namespaces=granted,
    )


def _bearer(metadata: Mapping[str, str | bytes]) -> str | None:
    value = metadata.get("authorization")
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    scheme, _, token = text.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("authorization must be a bearer token")
    return token.strip()


class Authenticator:
    """Maps a call's metadata to its :class:`Principal` (the server interceptor's hook).

    ``principals=None`` is development mode: every caller is the DEV principal,
    whatever credentials it sends. ``delegation=True`` (Metasrv) honours
    :data:`ON_BEHALF_OF_HEADER`; otherwise the header is ignored.
    """

    def __init__(self, principals: PrincipalMap | None, *, delegation: bool = False) -> None:
        self._map = principals
        self._delegation = delegation

    def __repr__(self) -> str:
        mode = "development" if self._map is None else repr(self._map)
        return f"Authenticator({mode}, delegation={self._delegation})"

    @property
    def development(self) -> bool:
        return self._map is None

    @classmethod
    def single_admin(cls, token: Secret, *, delegation: bool = False) -> Authenticator:
        return cls(PrincipalMap.of({token.reveal(): ADMIN_PRINCIPAL}), delegation=delegation)

    def authenticate(self, metadata: Mapping[str, str | bytes]) -> Principal:
        if self._map is None:
            caller = DEV_PRINCIPAL
        else:
            token = _bearer(metadata)
            if token is None:
                raise Unauthenticated("authentication required: send a bearer token")
            found = self._map.lookup(token)
            if found is None:
                raise Unauthenticated("invalid bearer token")
            caller = found
        delegated = metadata.get(ON_BEHALF_OF_HEADER) if self._delegation else None
        if delegated is None:
            return caller
        return _delegate(caller, decode_on_behalf_of(delegated))

    def __call__(self, metadata: Mapping[str, str | bytes], peer: str, method: str) -> Principal:
        return self.authenticate(metadata)
