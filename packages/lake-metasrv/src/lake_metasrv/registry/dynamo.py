"""The cloud registry: one DynamoDB table, single-item conditional writes only.

The key layout (``(family#shard, full key)``: ``meta#0``, ``lease#0``,
``dir#<shard>``, ``ver#<incarnation>``, ``op#<shard>``, ``dropped#0``) is in
:mod:`lake_metasrv.registry.dynamo_layout`; the table's client and single-item
calls in :mod:`~lake_metasrv.registry.dynamo_table`; version and operation
records in :mod:`~lake_metasrv.registry.dynamo_records`; pruning and a new
leader's takeover in :mod:`~lake_metasrv.registry.dynamo_upkeep`.

DynamoDB here has no transactions (dynalite has no TransactWriteItems), so a
commit group (one version holding one or more appends) is a short sequence of
single-item writes with one visibility point::

    1. put op#s/<op>    for every append of the group, concurrently:
                        state=pending, intended version v+1    (if absent or pending)
    2. update dir head  version v -> v+1, last_op=<op,op,...>, fence=<epoch>
                        if incarnation matches, version = v, fence <= epoch  <- visible
    3. put ver#<inc>/v+1 (naming every op), mark each op#s/<op> committed
                        (one BatchWriteItem)                     (repairable from the head)
    4. add 1 to the generation                                   (repairable: bump again)

Steps 3 and 4 are one flush shared by the commits of every table (see
``_flush_owed``): a commit waits for the next flush that had not started
when its head moved, so tables committing at once share its requests.

A group is all or none: its operation records are only pending until the one
head update names them all; a crash before it leaves every one of them
resolving to "not committed", a crash after it every one to the shared version.

A crash between any two steps is recoverable. Before step 2 nothing is
visible and a pending operation record resolves to "not committed". After
step 2 the head itself names the group's operations (``last_op``, comma-separated) and holds every
field of its version record, so the next commit on that table (or a new
leader's takeover) writes the missing record; a pending operation resolves
to committed exactly when the head or its version record names it among its operations, and a
retry with the same operation id returns that original version.

A maintenance commit (compaction, a new index) keeps the Lake version: one
conditional update of the head (``ever`` moves, conditioned on incarnation,
version, the expected ``ever`` and the fence) is its visibility point; the
version record is then rewritten from the head, owed like an append's.

Fencing: each head carries the epoch of the last leader that wrote it, and
every write is conditioned on ``fence <= my epoch``. A new leader stamps
every head with its epoch at takeover, so a paused old leader's late write
fails instead of landing. ``fence`` (a callable) also refuses to start a
write once this node's lease has run out.

Catalog snapshots read the authority marker and generation, page through the
directory 64 heads at a time (each entry is accounted against a byte budget
before it is kept), then read the generation again; the directory is
returned only when both reads match. Without the authority marker snapshots
fail closed. One full snapshot runs per process at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from lake_core import faults
from lake_core.errors import (
    FailedPrecondition,
    Internal,
    InvalidAppend,
    NotLeader,
    ResourceExhausted,
    StaleReadVersion,
    TableExists,
    TableNotFound,
    Unavailable,
)
from lake_core.names import TableRef
from lake_metasrv.registry.base import (
    AppendCommit,
    DroppedTable,
    MaintenanceCommit,
    OperationRecord,
    RegistryStore,
    TableRecord,
    VersionRecord,
    join_operation_ids,
    split_operation_ids,
)
from lake_metasrv.registry.dynamo_layout import (
    DIR_SHARDS,
    DROPPED,
    META,
    conditional_failed,
    decode,
    dir_key,
    dynamo_client_config,
    ensure_table,
    entry_bytes,
    head_record,
    item_key,
    n_attr,
    op_key,
    s_attr,
    ver_key,
)
from lake_metasrv.registry.dynamo_records import (
    Owed,
    committed_item,
    operation_record,
    resolve_pending,
    version_item,
    write_version,
)
from lake_metasrv.registry.dynamo_table import DynamoTable
from lake_metasrv.registry.dynamo_upkeep import Superseded, fence_every_head, prune_operations

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "DynamoRegistry",
    "NotLeader",
    "dynamo_client_config",
    "ensure_table",
]

log = structlog.get_logger("lake_metasrv.registry.dynamo")

#: Upper bound of one catalog snapshot held in memory.
MAX_SNAPSHOT_BYTES = 128 * 1024 * 1024
SNAPSHOT_ATTEMPTS = 5
Fence = Callable[[], int]


class DynamoRegistry(RegistryStore):
    """:class:`RegistryStore` in one DynamoDB table (see the module docstring).

    ``client`` is an open aiobotocore DynamoDB client (shared with the lease);
    without one, :meth:`open` creates its own from ``endpoint_url``/``region``.
    ``fence`` returns the epoch this node writes with, or raises
    :class:`NotLeader`; the default (epoch 0) suits a single writer.
    """

    def __init__(
        self,
        table: str,
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        fence: Fence | None = None,
        provision: bool = True,
        fault_points: faults.Faults | None = None,
    ) -> None:
        self.db = DynamoTable(
            table, client=client, endpoint_url=endpoint_url, region=region, provision=provision
        )
        self.fence: Fence = fence or (lambda: 0)
        self._registry_id = ""
        self._snapshot_lock = asyncio.Lock()
        #: Heads moved by this process whose version/operation records are not yet written.
        self._unsynced: dict[TableRef, Owed] = {}
        self._generation_owed = False
        #: The post-commit flush not started yet: every commit whose head moved
        #: since the running one started waits for it (see :meth:`_flush_owed`).
        self._next_flush: asyncio.Future[None] | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._faults = fault_points or faults.Faults()

    def __repr__(self) -> str:
        return f"DynamoRegistry({self.table!r})"

    @property
    def table(self) -> str:
        return self.db.table

    @property
    def client(self) -> Any:
        return self.db.client

    async def open(self) -> None:
        await self.db.open()
        try:
            registry_id = await self.db.bootstrap()
        except BaseException:
            await self.db.close()
            raise
        if registry_id is not None:
            self._registry_id = registry_id

    async def close(self) -> None:
        if self._flushing is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flushing)
        await self.db.close()

    # -- generation -------------------------------------------------------------

    def _generation_text(self, counter: int) -> str:
        return f"{self._registry_id}:{counter}"

    async def _counter(self) -> int:
        item = await self.db.get(item_key(META, "generation"))
        return 0 if item is None else int(item["n"])

    async def generation(self) -> str:
        return self._generation_text(await self._counter())

    async def _bump_generation(self) -> str:
        reply = await self.db.call(
            "update_item",
            Key=item_key(META, "generation"),
            UpdateExpression="ADD n :one",
            ExpressionAttributeValues={":one": n_attr(1)},
            ReturnValues="UPDATED_NEW",
        )
        self._generation_owed = False
        return self._generation_text(int(reply["Attributes"]["n"]["N"]))

    async def _bump_or_owe(self) -> str | None:
        try:
            return await self._bump_generation()
        except Exception as exc:
            self._generation_owed = True
            log.warning("generation bump failed; retried before the next write", error=repr(exc))
            return None

    async def _flush_owed(self) -> None:
        """Write what moved heads owe (every table's) and bump the generation, shared.

        Called past a visibility point: when it returns, a flush that started
        after the caller's head moved has written the caller's version and
        operation records and added one to the generation (or left what
        failed owed, as :meth:`_settle` does: retried before the table's next
        write). Commits of different tables share flushes: a caller joins the
        next flush, one not started yet, and one runs at a time, so the
        records of every table that committed meanwhile go in one
        BatchWriteItem and the one generation item is written once per round
        instead of once per commit. Every DynamoDB request costs the event
        loop botocore's work, and that work is what tables committing at once
        share.
        """
        waiting = self._next_flush
        if waiting is None:
            waiting = self._next_flush = asyncio.get_running_loop().create_future()
            if self._flushing is None:
                self._start_flush()
        await asyncio.shield(waiting)

    def _start_flush(self) -> None:
        waiting, self._next_flush = self._next_flush, None
        assert waiting is not None

        async def flush() -> None:
            try:
                await self._flush_once()
            except Exception as exc:
                # Not a DynamoDB failure (those are handled inside): whatever it
                # owed stays owed, written before each table's next write.
                self._generation_owed = True
                log.warning(
                    "post-commit registry flush failed; retried before the next write",
                    error=repr(exc),
                )
            finally:
                waiting.set_result(None)
                self._flushing = None
                if self._next_flush is not None:
                    self._start_flush()

        self._flushing = asyncio.ensure_future(flush())

    async def _flush_once(self) -> None:
        debts: list[tuple[TableRef, Owed]] = []
        items: dict[tuple[str, str], Any] = {}
        for ref, debt in list(self._unsynced.items()):
            owed = [
                version_item(debt.record, debt.stored_ops, debt.committed_at_ms),
                *(committed_item(op) for op in debt.committed()),
            ]
            keys = [(item["pk"]["S"], item["sk"]["S"]) for item in owed]
            if any(key in items for key in keys):
                continue  # one id in two tables' groups: settled by the table's next write
            items.update(zip(keys, owed, strict=True))
            debts.append((ref, debt))
        written, bumped = await asyncio.gather(
            self.db.put_many(list(items.values())), self._bump_generation(), return_exceptions=True
        )
        if isinstance(written, BaseException):
            log.warning(
                "post-commit registry writes deferred",
                tables=len(debts),
                error=repr(written),
            )
        else:
            for ref, debt in debts:
                if self._unsynced.get(ref) is debt:
                    del self._unsynced[ref]
        if isinstance(bumped, BaseException):
            self._generation_owed = True
            log.warning("generation bump failed; retried before the next write", error=repr(bumped))

    # -- reads ------------------------------------------------------------------

    async def get_table(self, table: TableRef) -> TableRecord | None:
        values = await self.db.get(dir_key(table))
        return None if values is None else head_record(values)

    async def _authority(self) -> tuple[dict[str, Any], int]:
        """The authority marker and generation counter, in one consistent Query."""
        marker: dict[str, Any] | None = None
        counter = 0
        async for item in self.db.query(META):
            if item["sk"] == "authority":
                marker = item
            elif item["sk"] == "generation":
                counter = int(item["n"])
        if marker is None or not marker.get("registry_id"):
            raise FailedPrecondition(
                f"registry table {self.table} has no directory authority marker; "
                "catalog snapshots fail closed until Metasrv initializes or migrates it"
            )
        self._registry_id = marker["registry_id"]
        return marker, counter

    async def snapshot(self) -> tuple[str, list[TableRecord]]:
        generation, records = await self.snapshot_if_changed(None)
        assert records is not None
        return generation, records

    async def snapshot_if_changed(
        self, generation: str | None
    ) -> tuple[str, list[TableRecord] | None]:
        _, counter = await self._authority()
        if generation is not None and generation == self._generation_text(counter):
            return generation, None
        async with self._snapshot_lock:  # one full directory in memory per process
            for _ in range(SNAPSHOT_ATTEMPTS):
                before = counter
                records = await self._scan_directory()
                _, counter = await self._authority()
                if counter == before:
                    records.sort(key=lambda r: (r.table.namespace, r.table.name))
                    return self._generation_text(counter), records
        raise Unavailable("the catalog kept changing during the snapshot; retry")

    async def _scan_directory(self) -> list[TableRecord]:
        budget = MAX_SNAPSHOT_BYTES
        records: list[TableRecord] = []
        for shard in range(DIR_SHARDS):
            async for values in self.db.query(f"dir#{shard}"):
                budget -= entry_bytes(values)  # accounted before it is kept
                if budget < 0:
                    raise ResourceExhausted(
                        f"the catalog exceeds {MAX_SNAPSHOT_BYTES} bytes per snapshot"
                    )
                records.append(head_record(values))
        return records

    async def get_operation(self, operation_id: str) -> OperationRecord | None:
        values = await self.db.get(op_key(operation_id))
        if values is None:
            return None
        if values.get("st") == "committed":
            return operation_record(values)
        return await resolve_pending(self.db, values)

    async def get_operations(self, operation_ids: Sequence[str]) -> dict[str, OperationRecord]:
        """One batch read for a commit group (each id as :meth:`get_operation` answers it)."""
        ids = list(dict.fromkeys(operation_ids))
        return await self._operations(await self.db.get_many([op_key(i) for i in ids]))

    async def get_table_and_operations(
        self, table: TableRef, operation_ids: Sequence[str]
    ) -> tuple[TableRecord | None, dict[str, OperationRecord]]:
        """A commit group's first read: the head and the group's operation records, one request.

        One BatchGetItem (strongly consistent) instead of a GetItem beside
        it: every DynamoDB request costs the event loop botocore's work, and
        with many tables committing at once that work is what they share.
        """
        head_key = dir_key(table)
        ids = list(dict.fromkeys(operation_ids))
        items = await self.db.get_many([head_key, *(op_key(i) for i in ids)])
        head = next((v for v in items if v["pk"] == head_key["pk"]["S"]), None)
        found = await self._operations([v for v in items if v is not head])
        return (None if head is None else head_record(head)), found

    async def _operations(self, items: Sequence[dict[str, Any]]) -> dict[str, OperationRecord]:
        found: dict[str, OperationRecord] = {}
        for values in items:
            if values.get("st") == "committed":
                found[values["sk"]] = operation_record(values)
            else:
                resolved = await resolve_pending(self.db, values)
                if resolved is not None:
                    found[values["sk"]] = resolved
        return found

    async def versions(self, incarnation: str) -> list[VersionRecord]:
        return [_version(incarnation, v) async for v in self.db.query(f"ver#{incarnation}")]

    async def version_record(self, incarnation: str, version: int) -> VersionRecord | None:
        found = await self.db.get(ver_key(incarnation, version))
        return None if found is None else _version(incarnation, found)

    async def dropped_tables(self) -> list[DroppedTable]:
        dropped = [
            DroppedTable(
                table=TableRef(d["ns"], d["name"]),
                incarnation=d["sk"],
                location=d["loc"],
                dropped_version=d["ver"],
                dropped_at_ms=d["at"],
            )
            async for d in self.db.query(DROPPED)
        ]
        return sorted(dropped, key=lambda d: (d.dropped_at_ms, d.incarnation))

    # -- writes -----------------------------------------------------------------

    async def _settle(self, table: TableRef | None = None) -> None:
        """Write what earlier commits of this process still owe; Unavailable if it cannot."""
        owed = [table] if table is not None else list(self._unsynced)
        try:
            for ref in owed:
                debt = self._unsynced.get(ref)
                if debt is None:
                    continue
                # Independent unconditional puts: one BatchWriteItem (per 25 records).
                await self.db.put_many(
                    [
                        version_item(debt.record, debt.stored_ops, debt.committed_at_ms),
                        *(committed_item(op) for op in debt.committed()),
                    ]
                )
                if self._unsynced.get(ref) is debt:
                    del self._unsynced[ref]
            if self._generation_owed:
                await self._bump_generation()
        except Exception as exc:
            raise self.db.unavailable(exc) from None

    async def create_table(self, record: TableRecord) -> str:
        if record.version != 0:
            raise Internal("a new table starts at version 0")
        self.fence()
        await self._settle()
        # The version record first: it names a fresh incarnation nobody else uses.
        await write_version(self.db, record, None, record.created_at_ms)
        epoch = self.fence()
        head = {
            "ns": record.table.namespace,
            "name": record.table.name,
            "inc": record.incarnation,
            "loc": record.location,
            "eng": record.engine,
            "schema": record.schema_ipc,
            "ver": 0,
            "ever": record.engine_version,
            "created": record.created_at_ms,
            "last_at": record.created_at_ms,
            "fence": epoch,
        }
        try:
            await self.db.put(
                head, dir_key(record.table), ConditionExpression="attribute_not_exists(pk)"
            )
        except Exception as exc:
            if conditional_failed(exc):
                raise TableExists(record.table) from None
            raise
        self._unsynced.pop(record.table, None)
        return await self._bump_or_owe() or await self.generation()

    async def drop_table(self, table: TableRef, incarnation: str, dropped_at_ms: int) -> str:
        self.fence()
        await self._settle(table)
        epoch = self.fence()
        try:
            reply = await self.db.call(
                "delete_item",
                Key=dir_key(table),
                ConditionExpression="inc = :inc AND (attribute_not_exists(fence) OR fence <= :epoch)",
                ExpressionAttributeValues={":inc": s_attr(incarnation), ":epoch": n_attr(epoch)},
                ReturnValues="ALL_OLD",
            )
        except Exception as exc:
            if not conditional_failed(exc):
                raise
            current = await self.db.get(dir_key(table))
            if current is None or current["inc"] != incarnation:
                raise TableNotFound(table) from None
            raise NotLeader(f"a newer Metasrv leader owns {table}; retry") from None
        old = decode(reply["Attributes"])
        dropped = {
            "ns": table.namespace,
            "name": table.name,
            "loc": old["loc"],
            "ver": old["ver"],
            "at": dropped_at_ms,
        }
        with contextlib.suppress(Exception):
            await write_version(self.db, head_record(old), old.get("last_op"), old["last_at"])
        try:
            await self.db.put(dropped, item_key(DROPPED, incarnation))
        except Exception as exc:
            # The drop is done (the head is gone); the record only helps GC.
            log.warning(
                "could not record the dropped incarnation", table=str(table), error=repr(exc)
            )
        return await self._bump_or_owe() or await self.generation()

    async def commit_append(self, commit: AppendCommit) -> TableRecord:
        table, operations = commit.table, commit.operations
        version = commit.version
        stored_ops = join_operation_ids(commit.operation_ids)
        if len(set(commit.operation_ids)) != len(operations):
            raise InvalidAppend("an operation id appears twice in one commit group")
        self.fence()
        await self._settle(table)
        pending = {
            "st": "pending",
            "ns": table.namespace,
            "name": table.name,
            "inc": commit.incarnation,
            "ver": version,
            "ever": commit.engine_version,
            "at": commit.committed_at_ms,
        }
        # Every append's pending record first, concurrently (one round trip);
        # none counts as committed until the head names it (step 2).
        puts = await asyncio.gather(
            *(
                self.db.put(
                    {**pending, "op_time": op.operation_time_ms},
                    op_key(op.operation_id),
                    ConditionExpression="attribute_not_exists(pk) OR st = :pending",
                    ExpressionAttributeValues={":pending": s_attr("pending")},
                )
                for op in operations
            ),
            return_exceptions=True,
        )
        for op, put in zip(operations, puts, strict=True):
            if isinstance(put, BaseException):
                if conditional_failed(put):
                    raise InvalidAppend(f"operation id {op.operation_id} is already committed")
                raise self.db.unavailable(put) from None

        epoch = self.fence()
        self._faults.stop(faults.STOP_BEFORE_HEAD_UPDATE)
        try:
            reply = await self.db.call(
                "update_item",
                Key=dir_key(table),
                UpdateExpression=(
                    "SET ver = :ver, ever = :ever, last_op = :op, last_at = :at, fence = :epoch"
                ),
                ConditionExpression=(
                    "inc = :inc AND ver = :expected "
                    "AND (attribute_not_exists(fence) OR fence <= :epoch)"
                ),
                ExpressionAttributeValues={
                    ":ver": n_attr(version),
                    ":ever": n_attr(commit.engine_version),
                    ":op": s_attr(stored_ops or ""),
                    ":at": n_attr(commit.committed_at_ms),
                    ":epoch": n_attr(epoch),
                    ":inc": s_attr(commit.incarnation),
                    ":expected": n_attr(commit.expected_version),
                },
                ReturnValues="ALL_NEW",
            )
            head = decode(reply["Attributes"])
        except Exception as exc:
            if not conditional_failed(exc):
                raise  # the visibility point may or may not have moved
            head = await self._classify_failed_cas(commit, epoch)
        record = head_record(head)
        self._unsynced[table] = Owed(record, stored_ops, int(head["last_at"]), operations)
        # Past the visibility point: the rest is owed, never a reason to fail.
        await self._flush_owed()
        return record

    async def _classify_failed_cas(self, commit: AppendCommit, epoch: int) -> dict[str, Any]:
        current = await self.db.get(dir_key(commit.table))
        if current is None or current["inc"] != commit.incarnation:
            raise TableNotFound(commit.table)
        if (
            current.get("last_op") == join_operation_ids(commit.operation_ids)
            and current["ver"] == commit.expected_version + 1
        ):
            return current  # our own write landed (a duplicate delivery)
        if int(current.get("fence", 0)) > epoch:
            log.warning(
                "commit fenced by a newer leader",
                table=str(commit.table),
                epoch=epoch,
                fence=current["fence"],
            )
            raise NotLeader(
                f"a newer Metasrv leader (epoch {current['fence']}) fenced this node's commit "
                f"to {commit.table}; retry with the same operation id"
            )
        raise StaleReadVersion(
            f"table {commit.table} is at version {current['ver']}, not {commit.expected_version}"
        )

    async def commit_maintenance(self, commit: MaintenanceCommit) -> TableRecord:
        """Move the head's Lance version only (same Lake version, ``last_op``, ``last_at``).

        One conditional update of the head is the visibility point, fenced
        like an append. The version record of the current Lake version is then
        rewritten from the head (owed, like an append's), keeping the
        operation id it names so a pending operation still resolves.
        """
        table = commit.table
        self.fence()
        # Earlier commits' records first: the head's last_op must be settled
        # before its version record is rewritten with the new Lance version.
        await self._settle(table)
        epoch = self.fence()
        try:
            reply = await self.db.call(
                "update_item",
                Key=dir_key(table),
                UpdateExpression="SET ever = :new, fence = :epoch",
                ConditionExpression=(
                    "inc = :inc AND ver = :ver AND ever = :expected "
                    "AND (attribute_not_exists(fence) OR fence <= :epoch)"
                ),
                ExpressionAttributeValues={
                    ":new": n_attr(commit.new_engine_version),
                    ":epoch": n_attr(epoch),
                    ":inc": s_attr(commit.incarnation),
                    ":ver": n_attr(commit.expected_version),
                    ":expected": n_attr(commit.expected_engine_version),
                },
                ReturnValues="ALL_NEW",
            )
            head = decode(reply["Attributes"])
        except Exception as exc:
            if not conditional_failed(exc):
                raise  # the head may or may not have moved
            head = await self._classify_failed_maintenance(commit, epoch)
        record = head_record(head)
        self._unsynced[table] = Owed(record, head.get("last_op"), int(head["last_at"]))
        await self._flush_owed()
        return record

    async def _classify_failed_maintenance(
        self, commit: MaintenanceCommit, epoch: int
    ) -> dict[str, Any]:
        current = await self.db.get(dir_key(commit.table))
        if current is None or current["inc"] != commit.incarnation:
            raise TableNotFound(commit.table)
        if (
            current["ver"] == commit.expected_version
            and current["ever"] == commit.new_engine_version
        ):
            return current  # our own write landed (a duplicate delivery)
        if int(current.get("fence", 0)) > epoch:
            raise NotLeader(
                f"a newer Metasrv leader (epoch {current['fence']}) fenced this node's "
                f"maintenance of {commit.table}; retry"
            )
        raise StaleReadVersion(
            f"table {commit.table} is at version {current['ver']} (Lance {current['ever']}), "
            f"not {commit.expected_version} (Lance {commit.expected_engine_version}); "
            "maintenance not applied"
        )

    async def prune_operations(self, older_than_ms: int) -> int:
        return await prune_operations(self.db, older_than_ms)

    # -- leadership -----------------------------------------------------------------

    async def take_authority(self, epoch: int) -> int:
        """A new leader's takeover: raise the authority epoch, fence every head, repair.

        Every head is stamped with ``epoch`` (so writes of older epochs fail),
        and the version record of its current version is (re)written from the
        head itself. Returns the number of tables fenced.
        """
        try:
            fenced = await fence_every_head(self.db, epoch)
        except Superseded as exc:
            raise NotLeader(str(exc)) from None
        self._unsynced.clear()
        await self._bump_generation()
        return fenced


def _version(incarnation: str, item: dict[str, Any]) -> VersionRecord:
    return VersionRecord(
        incarnation=incarnation,
        version=int(item["sk"]),
        engine_version=item["ever"],
        committed_at_ms=item["at"],
        operation_ids=split_operation_ids(item.get("op")),
    )
