"""Leader election: one lease item in the registry table, renewed by the leader.

The lease (``lease#0 / metasrv``) names its owner, a monotonic ``epoch``,
the leader's advertised URL (followers forward writes there) and a record
version number (``rvn``) that every renewal replaces.

- **Acquire.** A candidate watches the record. It may take it when it is
  missing, released, or when the same ``rvn`` has been in place for a whole
  TTL by the candidate's own monotonic clock (the owner stopped renewing).
  Taking it is one conditional write on the ``rvn`` it watched, raising the
  epoch: of several candidates exactly one wins.
- **Renew.** The leader replaces ``rvn`` every TTL/5, conditioned on still
  being the owner at its epoch.
- **Stop before another can win.** The leader may commit only until
  ``send time of its last successful renewal + TTL - margin``. Any candidate
  started its TTL after seeing that renewal, which was applied after it was
  sent, so the leader stops first. A leader that was paused (SIGSTOP) finds
  its deadline passed as soon as it runs again; a write it had already
  started is caught by the registry's fence (every head carries the epoch
  of the last leader that wrote it, see ``registry.dynamo``).
- **Resign.** On shutdown the leader first stops committing, then marks the
  lease released, so a standby takes over at its next poll instead of
  waiting out the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from lake_core.telemetry import series
from lake_metasrv.registry.dynamo import NotLeader
from lake_metasrv.registry.dynamo_layout import (
    META,
    conditional_failed,
    decode,
    error_code,
    item_key,
)

__all__ = ["DEFAULT_LEASE_TTL_S", "LEASE_KEY", "Leadership", "LeaseRecord"]

log = structlog.get_logger("lake_metasrv.lease")

DEFAULT_LEASE_TTL_S = 10.0
LEASE_KEY = item_key("lease#0", "metasrv")


@dataclass(frozen=True)
class LeaseRecord:
    owner: str
    epoch: int
    rvn: str
    url: str
    released: bool

    @classmethod
    def of(cls, item: dict[str, Any]) -> LeaseRecord:
        values = decode(item)
        return cls(
            owner=values.get("owner", ""),
            epoch=int(values.get("epoch", 0)),
            rvn=values.get("rvn", ""),
            url=values.get("url", ""),
            released=bool(values.get("released", False)),
        )


def node_id() -> str:
    return f"{socket.gethostname()[:40]}-{uuid.uuid4().hex[:12]}"


class Leadership:
    """This node's view of the lease, and the loop that keeps or seeks it.

    ``on_elected(epoch)`` runs once per won election before this node
    commits anything (the registry takeover); until it returns, and whenever
    the lease is not valid, :meth:`epoch` raises :class:`NotLeader`.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        url: str,
        *,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        on_elected: Callable[[int], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        node: str | None = None,
    ) -> None:
        self.client = client
        self.table = table
        self.url = url
        self.node = node or node_id()
        self.ttl_s = ttl_s
        self.renew_every_s = ttl_s / 5
        self.poll_s = min(0.5, ttl_s / 10)
        self.margin_s = max(0.2, ttl_s / 10)
        self.on_elected = on_elected
        self._clock = clock
        self._epoch = 0
        self._leading = False
        self._ready = False
        self._valid_until = float("-inf")
        self._last_renew = float("-inf")
        self._seen: LeaseRecord | None = None
        self._seen_since = 0.0
        self._task: asyncio.Task[None] | None = None
        self._takeover: asyncio.Task[None] | None = None
        self._stopping = False
        self.changed = asyncio.Event()
        # Read at scrape time (lake_metasrv_leader, lake_metasrv_lease_epoch).
        series.LEADER.set_function(lambda: float(self.is_leader))
        series.LEASE_EPOCH.set_function(lambda: float(self.view()["epoch"]))

    def __repr__(self) -> str:
        state = f"leader epoch {self._epoch}" if self.is_leader else "follower"
        return f"Leadership({self.node!r}, {state})"

    # -- what the rest of Metasrv asks ----------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leading and self._ready and self._clock() < self._valid_until

    def epoch(self) -> int:
        """The epoch to write with, or NotLeader when this node may not commit now."""
        if not self._leading:
            raise NotLeader("this Metasrv is not the leader; retry (writes go to the leader)")
        if not self._ready:
            raise NotLeader("this Metasrv is taking over leadership; retry in a moment")
        if self._clock() >= self._valid_until:
            raise NotLeader("this Metasrv's lease ran out; retry (writes go to the new leader)")
        return self._epoch

    def view(self) -> dict[str, Any]:
        """This node's role, the epoch it knows and how long the lease it knows lasts."""
        now = self._clock()
        seen = self._seen
        if self._leading:
            remaining = self._valid_until - now
        elif seen is not None and not seen.released:
            # A follower's bound: the holder must renew within a TTL of when it was seen.
            remaining = self._seen_since + self.ttl_s - now
        else:
            remaining = 0.0
        return {
            "role": "leader" if self.is_leader else "follower",
            "epoch": max(self._epoch, seen.epoch if seen is not None else 0),
            "lease_expires_in_ms": max(0, round(remaining * 1000)),
            "advertised_url": self.url,
            "leader_url": self.url if self._leading else (self.leader_url or ""),
        }

    async def settled(self, timeout_s: float) -> None:
        """Wait, at most ``timeout_s``, until this node leads or knows who does.

        Covers the moments right after a start or an election: a node that
        has just won is still taking over (its writes wait for that rather
        than fail), and a node that has just started has not read the lease.
        """
        deadline = time.monotonic() + timeout_s
        while not (self.is_leader or self.leader_url is not None):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, self.poll_s))

    @property
    def leader_url(self) -> str | None:
        """Where the current leader listens (None if unknown, or if it is this node)."""
        seen = self._seen
        if self._leading or seen is None or seen.released or not seen.owner:
            return None
        if seen.owner == self.node:
            return None
        return seen.url or None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start watching (and seeking) the lease in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="lake-metasrv-lease")

    async def close(self) -> None:
        self._stopping = True
        for task in (self._takeover, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._takeover = None

    async def resign(self) -> bool:
        """Stop committing now, then release the lease for a standby. True if released."""
        self._stopping = True
        was_leading, epoch = self._leading, self._epoch
        self._step_down("resigning")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if not was_leading:
            return False
        try:
            await self.client.update_item(
                TableName=self.table,
                Key=LEASE_KEY,
                UpdateExpression="SET released = :yes, rvn = :rvn",
                ConditionExpression="#owner = :me AND epoch = :epoch",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues={
                    ":yes": {"BOOL": True},
                    ":rvn": {"S": uuid.uuid4().hex},
                    ":me": {"S": self.node},
                    ":epoch": {"N": str(epoch)},
                },
            )
        except Exception as exc:
            log.warning("could not release the lease; a standby waits out the TTL", error=repr(exc))
            return False
        log.info("leadership resigned", epoch=epoch, node=self.node)
        series.LEADER_CHANGES.inc(event="resigned")
        return True

    # -- the loop -------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopping:
            try:
                if self._leading:
                    await self._lead()
                else:
                    await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the loop alive through any storage hiccup
                log.warning("lease loop error", error=repr(exc))
                await asyncio.sleep(self.poll_s)

    async def _lead(self) -> None:
        now = self._clock()
        if now >= self._valid_until:
            self._step_down("lease ran out before it could be renewed")
            return
        if now - self._last_renew >= self.renew_every_s:
            await self._renew()
        await asyncio.sleep(min(self.poll_s, max(0.01, self._valid_until - self._clock())))

    async def _renew(self) -> None:
        sent = self._clock()
        rvn = uuid.uuid4().hex
        try:
            await self.client.update_item(
                TableName=self.table,
                Key=LEASE_KEY,
                UpdateExpression="SET rvn = :rvn",
                ConditionExpression="#owner = :me AND epoch = :epoch AND released = :no",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues={
                    ":rvn": {"S": rvn},
                    ":me": {"S": self.node},
                    ":epoch": {"N": str(self._epoch)},
                    ":no": {"BOOL": False},
                },
            )
        except Exception as exc:
            if conditional_failed(exc):
                self._step_down("another node holds the lease")
            else:
                log.warning("lease renewal failed", error=error_code(exc) or repr(exc))
            return
        self._last_renew = sent
        self._valid_until = max(self._valid_until, sent + self.ttl_s - self.margin_s)

    async def _follow(self) -> None:
        reply = await self.client.get_item(TableName=self.table, Key=LEASE_KEY, ConsistentRead=True)
        item = reply.get("Item")
        now = self._clock()
        record = None if item is None else LeaseRecord.of(item)
        if record is None or self._seen is None or record.rvn != self._seen.rvn:
            self._seen_since = now
        if record != self._seen:
            self._seen = record
            self.changed.set()
            self.changed = asyncio.Event()
        if record is None:
            await self._acquire(None)
        elif record.released or now - self._seen_since >= self.ttl_s:
            await self._acquire(record)
        if not self._leading:
            await asyncio.sleep(self.poll_s)

    async def _acquire(self, seen: LeaseRecord | None) -> None:
        if self._stopping:
            return
        sent = self._clock()
        rvn = uuid.uuid4().hex
        epoch = max(seen.epoch if seen else 0, await self._authority_epoch()) + 1
        values = {
            "owner": {"S": self.node},
            "epoch": {"N": str(epoch)},
            "rvn": {"S": rvn},
            "url": {"S": self.url},
            "released": {"BOOL": False},
        }
        try:
            if seen is None:
                await self.client.put_item(
                    TableName=self.table,
                    Item={**LEASE_KEY, **values},
                    ConditionExpression="attribute_not_exists(pk)",
                )
            else:
                await self.client.update_item(
                    TableName=self.table,
                    Key=LEASE_KEY,
                    UpdateExpression=(
                        "SET #owner = :owner, epoch = :epoch, rvn = :rvn, #url = :url, "
                        "released = :released"
                    ),
                    ConditionExpression="rvn = :seen",
                    ExpressionAttributeNames={"#owner": "owner", "#url": "url"},
                    ExpressionAttributeValues={
                        **{f":{k}": v for k, v in values.items()},
                        ":seen": {"S": seen.rvn},
                    },
                )
        except Exception as exc:
            if not conditional_failed(exc):
                log.warning("lease acquisition failed", error=error_code(exc) or repr(exc))
            return  # another candidate won; keep watching
        self._epoch = epoch
        self._leading = True
        self._ready = False
        self._last_renew = sent
        self._valid_until = sent + self.ttl_s - self.margin_s
        self._seen = LeaseRecord(self.node, epoch, rvn, self.url, False)
        log.info("leadership acquired", epoch=epoch, node=self.node, url=self.url)
        series.LEADER_CHANGES.inc(event="acquired")
        self._takeover = asyncio.create_task(self._take_over(epoch), name="lake-metasrv-takeover")

    async def _authority_epoch(self) -> int:
        reply = await self.client.get_item(
            TableName=self.table, Key=item_key(META, "authority"), ConsistentRead=True
        )
        item = reply.get("Item")
        return 0 if item is None else int(decode(item).get("epoch", 0))

    async def _take_over(self, epoch: int) -> None:
        try:
            if self.on_elected is not None:
                await self.on_elected(epoch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("takeover failed; giving up the lease", epoch=epoch, error=repr(exc))
            self._step_down("takeover failed")
            return
        if self._leading and self._epoch == epoch:
            self._ready = True
            self.changed.set()
            self.changed = asyncio.Event()
            log.info("leader ready", epoch=epoch, node=self.node)
            series.LEADER_CHANGES.inc(event="ready")

    def _step_down(self, reason: str) -> None:
        if self._leading:
            log.warning("leadership lost", reason=reason, epoch=self._epoch, node=self.node)
            series.LEADER_CHANGES.inc(event="lost")
        self._leading = False
        self._ready = False
        self._valid_until = float("-inf")
        # Watch afresh: the next acquisition needs a full TTL of silence again.
        self._seen = None
        if self._takeover is not None and not self._takeover.done():
            self._takeover.cancel()
