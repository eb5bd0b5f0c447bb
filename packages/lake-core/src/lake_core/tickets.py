"""Sealed tickets: AES-256-GCM capabilities bound to who may redeem them.

Wire form (all of it authenticated, the claims encrypted)::

    b"LKT1" | key-id length (1 byte) | key id | nonce (12 bytes) | ciphertext+tag

The associated data is the header plus the audience, so a ticket sealed for
one audience or under one key id never opens under another. Claims are
compact JSON, compressed: principal, tenant, audience, issue time, expiry and
a caller-defined body (for Query: the SQL and its pinned table versions).
"""

from __future__ import annotations

import base64
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lake_core.config import QUERY_TICKET_KEYS_FILE
from lake_core.errors import ConfigError, PermissionDenied, Unauthenticated
from lake_core.principal import Principal
from lake_core.private_file import check_private_file

__all__ = [
    "MAX_VERIFICATION_KEYS",
    "TicketKeyRing",
    "TicketSealer",
    "check_private_file",
    "ticket_key_id",
]

MAGIC = b"LKT1"
KEY_BYTES = 32
NONCE_BYTES = 12
MAX_VERIFICATION_KEYS = 3
_MAX_CLAIMS_BYTES = 4 * 1024 * 1024


def ticket_key_id(ticket: bytes) -> str | None:
    """The key id a ticket's header names, or None when it has no well-formed header.

    Not a proof of anything until the ticket opens (the header is authenticated
    data): it says which key to try, or that the ring no longer holds it.
    """
    if len(ticket) < len(MAGIC) + 2 or not ticket.startswith(MAGIC):
        return None
    end = len(MAGIC) + 1 + ticket[len(MAGIC)]
    if len(ticket) < end:
        return None
    try:
        return ticket[len(MAGIC) + 1 : end].decode()
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, repr=False)
class TicketKeyRing:
    """One active sealing key plus up to three verification-only keys."""

    active_id: str
    keys: dict[str, bytes]

    def __repr__(self) -> str:
        return f"TicketKeyRing(active_id={self.active_id!r}, key_ids={sorted(self.keys)!r})"

    @classmethod
    def ephemeral(cls) -> TicketKeyRing:
        """A process-local key, for loopback development only."""
        return cls(active_id="ephemeral", keys={"ephemeral": AESGCM.generate_key(256)})

    @classmethod
    def from_file(cls, path: Path, variable: str = QUERY_TICKET_KEYS_FILE) -> TicketKeyRing:
        """Load ``{"active": id, "keys": [{"id": ..., "key": base64}, ...]}``."""
        check_private_file(path, variable)
        try:
            doc = json.loads(path.read_text())
            active = doc["active"]
            entries = doc["keys"]
            keys = {str(e["id"]): base64.b64decode(e["key"], validate=True) for e in entries}
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                f"{variable}: {path} must be JSON "
                '{"active": "<id>", "keys": [{"id": "<id>", "key": "<base64 32 bytes>"}]}'
            ) from None
        if len(keys) != len(entries):
            raise ConfigError(f"{variable}: key ids in {path} must be unique")
        if active not in keys:
            raise ConfigError(f"{variable}: active key {active!r} is not among the keys")
        if len(keys) - 1 > MAX_VERIFICATION_KEYS:
            raise ConfigError(
                f"{variable}: at most {MAX_VERIFICATION_KEYS} verification keys besides the active one"
            )
        for key_id, key in keys.items():
            if len(key) != KEY_BYTES or not 0 < len(key_id.encode()) < 256:
                raise ConfigError(f"{variable}: key {key_id!r} must be 32 bytes (base64)")
        return cls(active_id=active, keys=keys)


class TicketSealer:
    """Seals and opens tickets for one audience with one key ring."""

    def __init__(self, ring: TicketKeyRing, audience: str, ttl_secs: int) -> None:
        self._ring = ring
        self._audience = audience.encode()
        self._ttl = ttl_secs
        self._ciphers = {kid: AESGCM(key) for kid, key in ring.keys.items()}

    def __repr__(self) -> str:
        return f"TicketSealer({self._ring!r}, ttl_secs={self._ttl})"

    def seal(
        self, principal: Principal, body: dict[str, Any], *, now: float | None = None
    ) -> bytes:
        issued = int(now if now is not None else time.time())
        claims = {
            "prn": principal.principal_id,
            "ten": principal.tenant_id,
            "aud": self._audience.decode(),
            "iat": issued,
            "exp": issued + self._ttl,
            "body": body,
        }
        plain = zlib.compress(json.dumps(claims, separators=(",", ":")).encode(), 1)
        kid = self._ring.active_id.encode()
        header = MAGIC + bytes([len(kid)]) + kid
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self._ring.active_id].encrypt(nonce, plain, header + self._audience)
        return header + nonce + sealed

    def open(
        self, ticket: bytes, principal: Principal, *, now: float | None = None
    ) -> dict[str, Any]:
        """Return the ticket's body, or raise if it is not this caller's valid ticket."""
        if len(ticket) < len(MAGIC) + 2 + NONCE_BYTES + 16 or not ticket.startswith(MAGIC):
            raise Unauthenticated("invalid ticket")
        kid_len = ticket[len(MAGIC)]
        header_end = len(MAGIC) + 1 + kid_len
        header = ticket[:header_end]
        cipher = self._ciphers.get(ticket[len(MAGIC) + 1 : header_end].decode(errors="replace"))
        if cipher is None:
            raise Unauthenticated("invalid ticket")
        nonce = ticket[header_end : header_end + NONCE_BYTES]
        try:
            plain = cipher.decrypt(
                nonce, ticket[header_end + NONCE_BYTES :], header + self._audience
            )
            decompressor = zlib.decompressobj()
            raw = decompressor.decompress(plain, _MAX_CLAIMS_BYTES)
            if decompressor.unconsumed_tail:
                raise Unauthenticated("invalid ticket")
            claims = json.loads(raw)
        except (InvalidTag, zlib.error, ValueError):
            raise Unauthenticated("invalid ticket") from None
        current = now if now is not None else time.time()
        if claims.get("aud") != self._audience.decode():
            raise Unauthenticated("invalid ticket")
        if not claims.get("iat", 0) - 60 <= current < claims.get("exp", 0):
            raise Unauthenticated("ticket expired")
        if claims.get("prn") != principal.principal_id or claims.get("ten") != principal.tenant_id:
            raise PermissionDenied("ticket was issued to another principal")
        body = claims.get("body")
        if not isinstance(body, dict):
            raise Unauthenticated("invalid ticket")
        return body
