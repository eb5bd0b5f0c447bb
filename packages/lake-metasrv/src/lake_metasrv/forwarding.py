"""Followers forward writes to the leader; every node serves reads itself.

A Metasrv that does not hold the lease answers describe and catalog
snapshots from the registry table (strongly consistent reads) and sends
writes to the leader named in the lease:

- **Appends** go over the peer channel with this node's own credential
  (``LAKE_PEER_AUTH_TOKEN_FILE``, a ``metadata_peer`` principal on the
  leader), naming the caller in the on-behalf-of header, so the leader
  authorizes the same end user (role ``user``, same tenant, intersected
  namespaces) and checks FILE cells against that tenant's prefix.
- **Create/drop** are administrative: the leader must see the administrator
  itself, so the caller's own credentials are relayed unchanged over the
  same verified channel.

The channel verifies the leader against ``LAKE_PEER_CA_FILE`` (and
``LAKE_PEER_SERVER_NAME``). Forwarded calls carry ``x-lake-forwarded`` and
are never forwarded twice: a node that lost the lease meanwhile answers
UNAVAILABLE and the caller retries (with the same operation id).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from lake_core import protocol, status
from lake_core.auth import ON_BEHALF_OF_HEADER, Secret
from lake_core.errors import WANTS_CODES, InvalidAppend, Unavailable
from lake_core.metaclient import DO_ACTION, MetaClient, lake_error
from lake_core.principal import Principal
from lake_core.proto import flight_pb2 as pb
from lake_core.telemetry.propagation import client_span
from lake_core.tls import ClientTLS
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.ingest import ingest_command, is_ingest
from lake_metasrv.lease import Leadership
from lake_metasrv.service import (
    MetaHandler,
    _append_command,
    _caller,
    _descriptor,
    _require_role,
    _unary_messages,
)

__all__ = ["FORWARDED_HEADER", "ForwardingMetaHandler", "PeerClient", "PeerClients"]

log = structlog.get_logger("lake_metasrv.forwarding")

Context = Any  # grpc.aio.ServicerContext

#: Marks a call one Metasrv forwarded to another.
FORWARDED_HEADER = "x-lake-forwarded"
# How long a write waits for this node to take over, or to learn the leader,
# before it is refused as Unavailable.
SETTLE_S = 5.0
_RELAYED = ("authorization", ON_BEHALF_OF_HEADER)
_WRITE_ACTIONS = frozenset(
    {protocol.CREATE_TABLE, protocol.DROP_TABLE, protocol.OPTIMIZE_TABLE, protocol.CREATE_INDEX}
)


class PeerClient(MetaClient):
    """A Metasrv client for follower-to-leader calls (marks every call as forwarded)."""

    def _call_metadata(self, on_behalf_of: Principal | None) -> tuple[tuple[str, str], ...]:
        return (*super()._call_metadata(on_behalf_of), (FORWARDED_HEADER, "1"))

    async def relay_action(
        self, action: pb.Action, metadata: tuple[tuple[str, str], ...]
    ) -> list[pb.Result]:
        """Send ``action`` with the caller's own credentials (``metadata``)."""
        with client_span(DO_ACTION) as trace:
            try:
                call = self._stub.DoAction(
                    action,
                    metadata=(*metadata, (FORWARDED_HEADER, "1"), WANTS_CODES, *trace),
                    timeout=self._timeout,
                )
                return [item async for item in call]
            except grpc.aio.AioRpcError as exc:
                raise lake_error(exc) from None


class PeerClients:
    """One :class:`PeerClient` per leader URL, built with this node's peer credential and CA."""

    def __init__(self, token: Secret | None, tls: ClientTLS, timeout_s: float = 30.0) -> None:
        self._token = token
        self._tls = tls
        self._timeout = timeout_s
        self._clients: dict[str, PeerClient] = {}

    def get(self, url: str) -> PeerClient:
        client = self._clients.get(url)
        if client is None:
            client = PeerClient(
                url,
                token=self._token,
                ca_pem=self._tls.ca_pem,
                server_name=self._tls.server_name,
                timeout_s=self._timeout,
            )
            self._clients[url] = client
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


def _forwarded(context: Context) -> bool:
    return any(key == FORWARDED_HEADER for key, _ in context.invocation_metadata() or ())


def _relayed_metadata(context: Context) -> tuple[tuple[str, str], ...]:
    kept = []
    for key, value in context.invocation_metadata() or ():
        if key in _RELAYED:
            kept.append((key, value.decode() if isinstance(value, bytes) else value))
    return tuple(kept)


class ForwardingMetaHandler(MetaHandler):
    """:class:`MetaHandler` that sends writes to the leader when this node is not it."""

    def __init__(
        self, coordinator: CommitCoordinator, leadership: Leadership, peers: PeerClients
    ) -> None:
        super().__init__(coordinator)
        self.leadership = leadership
        self.peers = peers

    def status(self) -> status.MetasrvStatus:
        view = self.leadership.view()
        return status.MetasrvStatus(
            node=self.leadership.node,
            role=view["role"],
            mode="cloud",
            epoch=view["epoch"],
            lease_expires_in_ms=view["lease_expires_in_ms"],
            advertised_url=view["advertised_url"],
            leader_url=view["leader_url"],
            version=status.lake_version(),
        )

    async def _leader(self, context: Context) -> PeerClient | None:
        """The leader to forward to, or None to handle the call here.

        Right after a start or an election the answer waits (at most
        :data:`SETTLE_S`) for this node to finish taking over, or to learn
        who leads, rather than refuse the write.
        """
        if self.leadership.is_leader or _forwarded(context):
            # Handled here: the coordinator refuses it if this node cannot commit.
            return None
        await self.leadership.settled(SETTLE_S)
        if self.leadership.is_leader:
            return None
        url = self.leadership.leader_url
        if url is None:
            raise Unavailable("no Metasrv leader is elected right now; retry shortly")
        return self.peers.get(url)

    async def do_action(self, action: pb.Action, context: Context) -> AsyncIterator[pb.Result]:
        leader = await self._leader(context) if action.type in _WRITE_ACTIONS else None
        if leader is None:
            async for result in super().do_action(action, context):
                yield result
            return
        _caller()  # authenticated here too, before anything leaves this node
        log.info("forwarding to the leader", action=action.type, leader=leader.addr)
        for result in await leader.relay_action(action, _relayed_metadata(context)):
            yield result

    async def do_put(
        self, messages: AsyncIterator[pb.FlightData], context: Context
    ) -> AsyncIterator[pb.PutResult]:
        leader = await self._leader(context)
        if leader is None:
            async for result in super().do_put(messages, context):
                yield result
            return
        principal = _caller()
        first = await anext(messages, None)
        if first is None:
            raise InvalidAppend("an append stream needs a descriptor and an Arrow schema")
        descriptor = _descriptor(first)
        ingest = is_ingest(descriptor)
        command = ingest_command(descriptor) if ingest else _append_command(descriptor)
        _require_role(principal, command.table, "user", "admin")

        async def stream() -> AsyncIterator[pb.FlightData]:
            yield first
            async for message in messages:
                yield message

        result: protocol.WireModel
        if ingest:
            # Streamed through, end marker included (lake_metasrv.ingest).
            log.info("forwarding to the leader", action="ingest", leader=leader.addr)
            result = await leader.ingest_messages(stream(), on_behalf_of=principal)
        else:
            log.info("forwarding to the leader", action="append", leader=leader.addr)
            result = await leader.append_messages(stream(), on_behalf_of=principal)
        yield pb.PutResult(app_metadata=protocol.encode(result))

    async def append_unary(self, body: bytes, context: Context) -> bytes:
        leader = await self._leader(context)
        if leader is None:
            return await super().append_unary(body, context)
        principal = _caller()
        messages = _unary_messages(body)
        command = _append_command(_descriptor(messages[0]))
        _require_role(principal, command.table, "user", "admin")
        log.info("forwarding to the leader", action="append", leader=leader.addr)
        raws = [message.SerializeToString() for message in messages]
        result = await leader.append_raw(raws, on_behalf_of=principal)
        return pb.PutResult(app_metadata=protocol.encode(result)).SerializeToString()
