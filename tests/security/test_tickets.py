"""Sealed tickets: tampered, expired, other principals' and rotated-out tickets.

Every refusal must come before the first byte of data: the client's first
read fails and no batch was ever received.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from lake_core.principal import Principal
from lake_core.tickets import TicketKeyRing, TicketSealer
from tests.security.cluster import (
    ROWS,
    SecureCluster,
    bearer,
    key_ring_file,
    statement,
)
from tools.lake_testing.servers import LakeProcess

SQL = "SELECT * FROM acme_ops.runs"
ALICE = Principal(
    principal_id="alice", tenant_id="acme", role="user", namespaces=frozenset({"acme_ops"})
)


def ticket_for(secure: SecureCluster, user: str, process: LakeProcess | None = None) -> bytes:
    with secure.flight(process) as client:
        info = client.get_flight_info(statement(SQL), bearer(secure.tokens[user]))
    return bytes(info.endpoints[0].ticket.ticket)


def redeem(
    secure: SecureCluster, ticket: bytes, user: str, process: LakeProcess | None = None
) -> tuple[int, BaseException | None]:
    """(rows received, the error that ended the stream, if any)."""
    rows = 0
    with secure.doget(process) as client:
        try:
            reader = client.do_get(flight.Ticket(ticket), bearer(secure.tokens[user]))
            for chunk in reader:
                rows += chunk.data.num_rows
        except (flight.FlightError, pa.ArrowException) as exc:
            return rows, exc
    return rows, None


def refused_before_data(
    secure: SecureCluster,
    ticket: bytes,
    user: str,
    kind: type[Exception],
    process: LakeProcess | None = None,
) -> str:
    rows, error = redeem(secure, ticket, user, process)
    assert rows == 0, "data was sent before the ticket was refused"
    assert isinstance(error, kind), error
    return str(error)


def sealer(secure: SecureCluster) -> TicketSealer:
    ring = TicketKeyRing.from_file(Path(secure.query_env["LAKE_QUERY_TICKET_KEYS_FILE"]))
    return TicketSealer(ring, "lake-query", 300)


# ``serving`` runs a test once per DoGet path: grpcio, and the native data plane
# (a replica of the same fleet redeems the tickets the first replica sealed).


def test_a_genuine_ticket_is_redeemed_by_its_principal(
    secure: SecureCluster, serving: LakeProcess
) -> None:
    assert redeem(secure, ticket_for(secure, "alice"), "alice", serving) == (ROWS, None)


@pytest.mark.parametrize("where", ["header", "nonce", "middle", "tag"])
def test_a_ticket_with_one_flipped_byte_is_refused(
    secure: SecureCluster, where: str, serving: LakeProcess
) -> None:
    raw = bytearray(ticket_for(secure, "alice"))
    index = {"header": 2, "nonce": 8, "middle": len(raw) // 2, "tag": len(raw) - 1}[where]
    raw[index] ^= 0x01
    refused_before_data(secure, bytes(raw), "alice", flight.FlightUnauthenticatedError, serving)


def test_an_expired_ticket_is_refused(secure: SecureCluster, serving: LakeProcess) -> None:
    # Reseal a genuine body as issued an hour ago, with the replicas' own key ring.
    seal = sealer(secure)
    body = seal.open(ticket_for(secure, "alice"), ALICE)
    expired = seal.seal(ALICE, body, now=time.time() - 3600)
    assert redeem(secure, seal.seal(ALICE, body), "alice", serving) == (ROWS, None)
    message = refused_before_data(
        secure, expired, "alice", flight.FlightUnauthenticatedError, serving
    )
    assert "expired" in message


def test_another_principals_ticket_is_refused(secure: SecureCluster, serving: LakeProcess) -> None:
    ticket = ticket_for(secure, "alice")
    # amy: same tenant, same grants, different principal.
    refused_before_data(secure, ticket, "amy", flight.FlightUnauthorizedError, serving)


def test_another_tenants_ticket_is_refused(secure: SecureCluster, serving: LakeProcess) -> None:
    ticket = ticket_for(secure, "alice")
    refused_before_data(secure, ticket, "bob", flight.FlightUnauthorizedError, serving)
    # The same principal id under another tenant does not redeem it either.
    impostor = Principal(principal_id="alice", tenant_id="globex", role="user", namespaces=None)
    seal = sealer(secure)
    forged = seal.seal(impostor, seal.open(ticket, ALICE))
    refused_before_data(secure, forged, "alice", flight.FlightUnauthorizedError, serving)


def test_another_audiences_ticket_is_refused(secure: SecureCluster, serving: LakeProcess) -> None:
    ring = TicketKeyRing.from_file(Path(secure.query_env["LAKE_QUERY_TICKET_KEYS_FILE"]))
    body = sealer(secure).open(ticket_for(secure, "alice"), ALICE)
    foreign = TicketSealer(ring, "another-fleet", 300).seal(ALICE, body)
    refused_before_data(secure, foreign, "alice", flight.FlightUnauthenticatedError, serving)


def test_an_oversized_ticket_is_refused_unopened(secure: SecureCluster) -> None:
    huge = ticket_for(secure, "alice") + b"\0" * (1024 * 1024)
    message = refused_before_data(secure, huge, "alice", pa.ArrowInvalid)
    assert "exceeds 1048576 bytes" in message


def test_staged_key_rotation(secure: SecureCluster) -> None:
    """Preload the new key, activate it, retire the old one (docs/security.md)."""
    old = TicketKeyRing.from_file(Path(secure.query_env["LAKE_QUERY_TICKET_KEYS_FILE"]))
    k1 = old.keys[old.active_id]
    k2 = os.urandom(32)
    root = secure.root

    def replica(name: str, active: str, keys: dict[str, bytes]) -> LakeProcess:
        ring = key_ring_file(root / f"ring-{name}.json", active, keys)
        return secure.add_query(name, {"LAKE_QUERY_TICKET_KEYS_FILE": str(ring)})

    preloaded = replica("preload", old.active_id, {old.active_id: k1, "k2": k2})
    activated = replica("activate", "k2", {"k2": k2, old.active_id: k1})
    retired = replica("retire", "k2", {"k2": k2})
    try:
        _rotate(secure, preloaded, activated, retired)
    finally:
        for process in (preloaded, activated, retired):
            process.stop()


def _rotate(
    secure: SecureCluster, preloaded: LakeProcess, activated: LakeProcess, retired: LakeProcess
) -> None:
    sealed_with_old = ticket_for(secure, "alice")  # the original fleet: k1 only
    sealed_with_new = ticket_for(secure, "alice", activated)

    # Stage 1, preload: replicas still seal with k1 but already accept k2.
    assert redeem(secure, sealed_with_new, "alice", preloaded) == (ROWS, None)
    # Stage 2, activate: k2 seals; k1 tickets in flight still redeem.
    assert redeem(secure, sealed_with_old, "alice", activated) == (ROWS, None)
    assert redeem(secure, sealed_with_new, "alice", activated) == (ROWS, None)
    # Stage 3, retire: k1 is gone and its tickets fail; k2 tickets keep working.
    refused_before_data(
        secure, sealed_with_old, "alice", flight.FlightUnauthenticatedError, retired
    )
    assert redeem(secure, sealed_with_new, "alice", retired) == (ROWS, None)
    # Why preload must reach every replica first: k1-only replicas refuse k2 tickets.
    refused_before_data(secure, sealed_with_new, "alice", flight.FlightUnauthenticatedError)
