from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from lake_core.errors import ConfigError, PermissionDenied, Unauthenticated
from lake_core.principal import Principal
from lake_core.tickets import TicketKeyRing, TicketSealer

ALICE = Principal(principal_id="alice", tenant_id="acme", role="user")
BOB = Principal(principal_id="bob", tenant_id="acme", role="user")
MALLORY = Principal(principal_id="alice", tenant_id="other", role="user")


def ring_file(
    path: Path, active: str, ids: list[str], keys: dict[str, bytes] | None = None
) -> Path:
    keys = keys or {}
    entries = [
        {"id": i, "key": base64.b64encode(keys.get(i, os.urandom(32))).decode()} for i in ids
    ]
    path.write_text(json.dumps({"active": active, "keys": entries}))
    path.chmod(0o600)
    return path


def test_round_trip_and_binding() -> None:
    sealer = TicketSealer(TicketKeyRing.ephemeral(), "lake-query", 300)
    ticket = sealer.seal(ALICE, {"sql": "SELECT 1"})
    assert b"SELECT" not in ticket
    assert sealer.open(ticket, ALICE) == {"sql": "SELECT 1"}
    with pytest.raises(PermissionDenied):
        sealer.open(ticket, BOB)
    with pytest.raises(PermissionDenied):
        sealer.open(ticket, MALLORY)


def test_every_flipped_byte_is_refused() -> None:
    sealer = TicketSealer(TicketKeyRing.ephemeral(), "lake-query", 300)
    ticket = sealer.seal(ALICE, {"sql": "SELECT 1"})
    for i in range(len(ticket)):
        forged = bytearray(ticket)
        forged[i] ^= 0x01
        with pytest.raises(Unauthenticated):
            sealer.open(bytes(forged), ALICE)


def test_expiry_and_audience() -> None:
    ring = TicketKeyRing.ephemeral()
    sealer = TicketSealer(ring, "lake-query", 10)
    ticket = sealer.seal(ALICE, {}, now=1000)
    assert sealer.open(ticket, ALICE, now=1009) == {}
    with pytest.raises(Unauthenticated, match="expired"):
        sealer.open(ticket, ALICE, now=1010)
    with pytest.raises(Unauthenticated):
        TicketSealer(ring, "another-fleet", 10).open(ticket, ALICE, now=1001)


def test_staged_rotation(tmp_path: Path) -> None:
    old, new = os.urandom(32), os.urandom(32)
    keys = {"old": old, "new": new}
    before = TicketKeyRing.from_file(ring_file(tmp_path / "a.json", "old", ["old"], keys))
    preloaded = TicketKeyRing.from_file(ring_file(tmp_path / "b.json", "old", ["old", "new"], keys))
    activated = TicketKeyRing.from_file(ring_file(tmp_path / "c.json", "new", ["new", "old"], keys))
    retired = TicketKeyRing.from_file(ring_file(tmp_path / "d.json", "new", ["new"], keys))
    ticket = TicketSealer(before, "q", 300).seal(ALICE, {"n": 1})
    assert TicketSealer(preloaded, "q", 300).open(ticket, ALICE) == {"n": 1}
    assert TicketSealer(activated, "q", 300).open(ticket, ALICE) == {"n": 1}
    with pytest.raises(Unauthenticated):
        TicketSealer(retired, "q", 300).open(ticket, ALICE)


def test_key_file_rules(tmp_path: Path) -> None:
    loose = ring_file(tmp_path / "loose.json", "k", ["k"])
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        TicketKeyRing.from_file(loose)
    with pytest.raises(ConfigError, match="at most 3 verification keys"):
        TicketKeyRing.from_file(ring_file(tmp_path / "many.json", "a", ["a", "b", "c", "d", "e"]))
    with pytest.raises(ConfigError, match="active key"):
        TicketKeyRing.from_file(ring_file(tmp_path / "inactive.json", "z", ["a"]))
    short = tmp_path / "short.json"
    short.write_text(
        json.dumps({"active": "a", "keys": [{"id": "a", "key": base64.b64encode(b"x").decode()}]})
    )
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="32 bytes"):
        TicketKeyRing.from_file(short)
    ring = TicketKeyRing.from_file(ring_file(tmp_path / "ok.json", "a", ["a"]))
    assert "key" not in repr(ring).replace("key_ids", "")
