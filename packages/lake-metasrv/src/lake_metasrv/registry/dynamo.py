"""The cloud registry: one DynamoDB table, single-item conditional writes only.

The key layout (``(family#shard, full key)``: ``meta#0``, ``lease#0``,
``dir#<shard>``, ``ver#<incarnation>``, ``op#<shard>``, ``dropped#0``) is in
:mod:`lake_metasrv.registry.dynamo_layout`.

DynamoDB here has no transactions (dynalite has no TransactWriteItems), so an
append is a short sequence of single-item writes with one visibility point::

    1. put op#s/<op>    state=pending, intended version v+1    (if absent or pending)
    2. update dir head  version v -> v+1, last_op=<op>, fence=<epoch>
                        if incarnation matches, version = v, fence <= epoch  <- visible
    3. put ver#<inc>/v+1, mark op#s/<op> committed              (repairable from the head)
    4. add 1 to the generation                                   (repairable: bump again)

A crash between any two steps is recoverable. Before step 2 nothing is
visible and a pending operation record resolves to "not committed". After
step 2 the head itself names the operation (``last_op``) and holds every
field of its version record, so the next commit on that table (or a new
leader's takeover) writes the missing record; a pending operation resolves
to committed exactly when the head or its version record names it, and a
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
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import structlog

from lake_core import faults
from lake_core.errors import (
    FailedPrecondition,
    Internal,
    InvalidAppend,
    ResourceExhausted,
    StaleReadVersion,
    TableExists,
    TableNotFound,
    Unavailable,
)
from lake_core.ids import operation_time_ms
from lake_core.models import Engine
from lake_core.names import TableRef
from lake_metasrv.registry.base import (
    AppendCommit,
    DroppedTable,
    MaintenanceCommit,
    OperationRecord,
    RegistryStore,
    TableRecord,
    VersionRecord,
)
from lake_metasrv.registry.dynamo_layout import (
    DIR_SHARDS,
    DROPPED,
    LAYOUT_VERSION,
    META,
    OP_SHARDS,
    PAGE_SIZE,
    REGISTRY_SCHEMA,
    Item,
    conditional_failed,
    decode,
    dir_key,
    dynamo_client_config,
    encode,
    ensure_table,
    entry_bytes,
    error_code,
    head_record,
    item_key,
    n_attr,
    op_bound,
    op_key,
    s_attr,
    ver_key,
)

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


class NotLeader(Unavailable):
    """This Metasrv may not write: it holds no valid lease, or a newer leader fenced it."""


@dataclass(frozen=True)
class _Owed:
    """Records a moved head still needs: its version record and operation record."""

    record: TableRecord
    operation_id: str | None
    operation_time_ms: int
    committed_at_ms: int
    #: False for a maintenance commit: the version record is owed, the
    #: operation record (written by the append itself) is not.
    operation_owed: bool = True


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
        self.table = table
        self.client: Any = client
        self._endpoint_url = endpoint_url
        self._region = region
        self.fence: Fence = fence or (lambda: 0)
        self._provision = provision
        self._stack: contextlib.AsyncExitStack | None = None
        self._registry_id = ""
        self._snapshot_lock = asyncio.Lock()
        #: Heads moved by this process whose version/operation records are not yet written.
        self._unsynced: dict[TableRef, _Owed] = {}
        self._generation_owed = False
        self._faults = fault_points or faults.Faults()

    def __repr__(self) -> str:
        return f"DynamoRegistry({self.table!r})"

    # -- plumbing -----------------------------------------------------------

    async def _call(self, method: str, **kwargs: Any) -> Any:
        if self.client is None:
            raise Internal(f"registry {self.table} is not open")
        return await getattr(self.client, method)(TableName=self.table, **kwargs)

    async def _read(self, method: str, **kwargs: Any) -> Any:
        """A read: any failure is UNAVAILABLE (retryable), never an internal error."""
        try:
            return await self._call(method, **kwargs)
        except Exception as exc:
            raise self._unavailable(exc) from None

    async def _get(self, key: Item) -> dict[str, Any] | None:
        reply = await self._read("get_item", Key=key, ConsistentRead=True)
        item = reply.get("Item")
        return None if item is None else decode(item)

    async def _query(
        self, pk: str, *, below: str | None = None, limit: int = PAGE_SIZE
    ) -> AsyncIterator[dict[str, Any]]:
        """Every item of one family (strongly consistent), ``limit`` per page."""
        condition = "pk = :pk" + (" AND sk < :below" if below is not None else "")
        values: Item = {":pk": s_attr(pk)}
        if below is not None:
            values[":below"] = s_attr(below)
        start: Item | None = None
        while True:
            kwargs: dict[str, Any] = {
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "ConsistentRead": True,
                "Limit": limit,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            reply = await self._read("query", **kwargs)
            for item in reply.get("Items", []):
                yield decode(item)
            start = reply.get("LastEvaluatedKey")
            if not start:
                return

    async def _put(self, values: dict[str, Any], key: Item, **kwargs: Any) -> None:
        await self._call("put_item", Item={**key, **encode(values)}, **kwargs)

    # -- lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        if self._stack is not None:
            return
        self._stack = contextlib.AsyncExitStack()
        try:
            if self.client is None:
                import aioboto3

                session = aioboto3.Session()
                self.client = await self._stack.enter_async_context(
                    session.client(
                        "dynamodb",
                        endpoint_url=self._endpoint_url,
                        region_name=self._region,
                        config=dynamo_client_config(),
                    )
                )
            if self._provision:
                await ensure_table(self.client, self.table, **REGISTRY_SCHEMA)
            await self._bootstrap()
        except BaseException:
            await self.close()
            raise

    async def _bootstrap(self) -> None:
        marker = await self._get(item_key(META, "authority"))
        if marker is None:
            if not await self._directory_empty():
                # A non-empty directory without its marker is not an authority
                # this process may vouch for: snapshots fail closed.
                log.error("registry authority marker missing", table=self.table)
                return
            fresh = {"registry_id": str(uuid.uuid4()), "layout": LAYOUT_VERSION, "epoch": 0}
            with contextlib.suppress(Exception):
                await self._put(
                    fresh,
                    item_key(META, "authority"),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            with contextlib.suppress(Exception):
                await self._put(
                    {"n": 0},
                    item_key(META, "generation"),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            marker = await self._get(item_key(META, "authority"))
            if marker is None:
                raise Unavailable(f"cannot initialize registry table {self.table}")
        if marker.get("layout") != LAYOUT_VERSION:
            raise Internal(
                f"registry {self.table} has layout {marker.get('layout')}, "
                f"this Metasrv reads layout {LAYOUT_VERSION}"
            )
        self._registry_id = marker["registry_id"]

    async def _directory_empty(self) -> bool:
        for shard in range(DIR_SHARDS):
            reply = await self._read(
                "query",
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": s_attr(f"dir#{shard}")},
                ConsistentRead=True,
                Limit=1,
            )
            if reply.get("Items"):
                return False
        return True

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
            self.client = None

    # -- generation -------------------------------------------------------------

    def _generation_text(self, counter: int) -> str:
        return f"{self._registry_id}:{counter}"

    async def _counter(self) -> int:
        item = await self._get(item_key(META, "generation"))
        return 0 if item is None else int(item["n"])

    async def generation(self) -> str:
        return self._generation_text(await self._counter())

    async def _bump_generation(self) -> str:
        reply = await self._call(
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

    # -- reads ------------------------------------------------------------------

    async def get_table(self, table: TableRef) -> TableRecord | None:
        values = await self._get(dir_key(table))
        return None if values is None else head_record(values)

    async def _authority(self) -> tuple[dict[str, Any], int]:
        """The authority marker and generation counter, in one consistent Query."""
        marker: dict[str, Any] | None = None
        counter = 0
        async for item in self._query(META):
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
            async for values in self._query(f"dir#{shard}"):
                budget -= entry_bytes(values)  # accounted before it is kept
                if budget < 0:
                    raise ResourceExhausted(
                        f"the catalog exceeds {MAX_SNAPSHOT_BYTES} bytes per snapshot"
                    )
                records.append(head_record(values))
        return records

    async def get_operation(self, operation_id: str) -> OperationRecord | None:
        values = await self._get(op_key(operation_id))
        if values is None:
            return None
        if values.get("st") == "committed":
            return self._operation(values)
        return await self._resolve_pending(values)

    def _operation(self, values: dict[str, Any]) -> OperationRecord:
        return OperationRecord(
            operation_id=values["sk"],
            table=TableRef(values["ns"], values["name"]),
            incarnation=values["inc"],
            location=values["loc"],
            engine=cast(Engine, values["eng"]),
            version=values["ver"],
            engine_version=values["ever"],
            operation_time_ms=values["op_time"],
            committed_at_ms=values["at"],
        )

    async def _resolve_pending(self, pending: dict[str, Any]) -> OperationRecord | None:
        """Whether a pending operation reached the visibility point (see module doc)."""
        operation_id, incarnation, version = pending["sk"], pending["inc"], pending["ver"]
        found = await self._get(ver_key(incarnation, version))
        if found is not None:
            if found.get("op") != operation_id:
                return None
            engine_version, at, location, engine = (
                found["ever"],
                found["at"],
                found["loc"],
                found["eng"],
            )
        else:
            # No version record: only the head's current version can lack one.
            head = await self._get(dir_key(TableRef(pending["ns"], pending["name"])))
            if head is None or head["inc"] != incarnation or head["ver"] != version:
                return None
            if head.get("last_op") != operation_id:
                return None
            engine_version, at, location, engine = (
                head["ever"],
                head["last_at"],
                head["loc"],
                head["eng"],
            )
        record = self._operation(
            {**pending, "ever": engine_version, "at": at, "loc": location, "eng": engine}
        )
        with contextlib.suppress(Exception):
            await self._write_version_of(record)
            await self._write_committed(record)
        return record

    async def versions(self, incarnation: str) -> list[VersionRecord]:
        return [
            VersionRecord(
                incarnation=incarnation,
                version=int(v["sk"]),
                engine_version=v["ever"],
                committed_at_ms=v["at"],
                operation_id=v.get("op"),
            )
            async for v in self._query(f"ver#{incarnation}")
        ]

    async def dropped_tables(self) -> list[DroppedTable]:
        dropped = [
            DroppedTable(
                table=TableRef(d["ns"], d["name"]),
                incarnation=d["sk"],
                location=d["loc"],
                dropped_version=d["ver"],
                dropped_at_ms=d["at"],
            )
            async for d in self._query(DROPPED)
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
                writes = [self._write_version(debt.record, debt.operation_id, debt.committed_at_ms)]
                if debt.operation_id and debt.operation_owed:
                    operation = OperationRecord(
                        operation_id=debt.operation_id,
                        table=debt.record.table,
                        incarnation=debt.record.incarnation,
                        location=debt.record.location,
                        engine=debt.record.engine,
                        version=debt.record.version,
                        engine_version=debt.record.engine_version,
                        operation_time_ms=debt.operation_time_ms,
                        committed_at_ms=debt.committed_at_ms,
                    )
                    writes.append(self._write_committed(operation))
                # Two independent single-item puts: one round trip.
                await asyncio.gather(*writes)
                if self._unsynced.get(ref) is debt:
                    del self._unsynced[ref]
            if self._generation_owed:
                await self._bump_generation()
        except Exception as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: BaseException) -> Unavailable:
        reason = error_code(exc) or type(exc).__name__
        return Unavailable(f"registry table {self.table} unavailable ({reason}); retry")

    async def _write_version(self, record: TableRecord, operation_id: str | None, at: int) -> None:
        values = {
            "ever": record.engine_version,
            "at": at,
            "op": operation_id or None,
            "ns": record.table.namespace,
            "name": record.table.name,
            "loc": record.location,
            "eng": record.engine,
        }
        await self._put(values, ver_key(record.incarnation, record.version))

    async def _write_version_of(self, op: OperationRecord) -> None:
        values = {
            "ever": op.engine_version,
            "at": op.committed_at_ms,
            "op": op.operation_id,
            "ns": op.table.namespace,
            "name": op.table.name,
            "loc": op.location,
            "eng": op.engine,
        }
        await self._put(values, ver_key(op.incarnation, op.version))

    async def _write_committed(self, op: OperationRecord) -> None:
        values = {
            "st": "committed",
            "ns": op.table.namespace,
            "name": op.table.name,
            "inc": op.incarnation,
            "loc": op.location,
            "eng": op.engine,
            "ver": op.version,
            "ever": op.engine_version,
            "op_time": op.operation_time_ms,
            "at": op.committed_at_ms,
        }
        await self._put(values, op_key(op.operation_id))

    async def create_table(self, record: TableRecord) -> str:
        if record.version != 0:
            raise Internal("a new table starts at version 0")
        self.fence()
        await self._settle()
        # The version record first: it names a fresh incarnation nobody else uses.
        await self._write_version(record, None, record.created_at_ms)
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
            await self._put(
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
            reply = await self._call(
                "delete_item",
                Key=dir_key(table),
                ConditionExpression="inc = :inc AND (attribute_not_exists(fence) OR fence <= :epoch)",
                ExpressionAttributeValues={":inc": s_attr(incarnation), ":epoch": n_attr(epoch)},
                ReturnValues="ALL_OLD",
            )
        except Exception as exc:
            if not conditional_failed(exc):
                raise
            current = await self._get(dir_key(table))
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
            await self._write_version(head_record(old), old.get("last_op"), old["last_at"])
        try:
            await self._put(dropped, item_key(DROPPED, incarnation))
        except Exception as exc:
            # The drop is done (the head is gone); the record only helps GC.
            log.warning(
                "could not record the dropped incarnation", table=str(table), error=repr(exc)
            )
        return await self._bump_or_owe() or await self.generation()

    async def commit_append(self, commit: AppendCommit) -> TableRecord:
        table, operation_id = commit.table, commit.operation_id
        version = commit.expected_version + 1
        self.fence()
        await self._settle(table)
        pending = {
            "st": "pending",
            "ns": table.namespace,
            "name": table.name,
            "inc": commit.incarnation,
            "ver": version,
            "ever": commit.engine_version,
            "op_time": commit.operation_time_ms,
            "at": commit.committed_at_ms,
        }
        try:
            await self._put(
                pending,
                op_key(operation_id),
                ConditionExpression="attribute_not_exists(pk) OR st = :pending",
                ExpressionAttributeValues={":pending": s_attr("pending")},
            )
        except Exception as exc:
            if conditional_failed(exc):
                raise InvalidAppend(f"operation id {operation_id} is already committed") from None
            raise self._unavailable(exc) from None

        epoch = self.fence()
        self._faults.stop(faults.STOP_BEFORE_HEAD_UPDATE)
        try:
            reply = await self._call(
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
                    ":op": s_attr(operation_id),
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
        self._unsynced[table] = _Owed(
            record, operation_id, commit.operation_time_ms, int(head["last_at"])
        )
        # Past the visibility point: the rest is owed, never a reason to fail.
        results = await asyncio.gather(
            self._settle(table), self._bump_or_owe(), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.warning(
                    "post-commit registry writes deferred", table=str(table), error=repr(result)
                )
        return record

    async def _classify_failed_cas(self, commit: AppendCommit, epoch: int) -> dict[str, Any]:
        current = await self._get(dir_key(commit.table))
        if current is None or current["inc"] != commit.incarnation:
            raise TableNotFound(commit.table)
        if (
            current.get("last_op") == commit.operation_id
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
            reply = await self._call(
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
        self._unsynced[table] = _Owed(
            record, head.get("last_op"), 0, int(head["last_at"]), operation_owed=False
        )
        results = await asyncio.gather(
            self._settle(table), self._bump_or_owe(), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.warning(
                    "post-maintenance registry writes deferred",
                    table=str(table),
                    error=repr(result),
                )
        return record

    async def _classify_failed_maintenance(
        self, commit: MaintenanceCommit, epoch: int
    ) -> dict[str, Any]:
        current = await self._get(dir_key(commit.table))
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
        bound = op_bound(older_than_ms)
        removed = 0
        for shard in range(OP_SHARDS):
            keys = [
                item_key(f"op#{shard}", item["sk"])
                async for item in self._query(f"op#{shard}", below=bound)
                if operation_time_ms(item["sk"]) < older_than_ms
            ]
            removed += await self._delete_all(keys)
        return removed

    async def _delete_all(self, keys: Iterable[Item]) -> int:
        keys = list(keys)
        for start in range(0, len(keys), 25):
            requests = [{"DeleteRequest": {"Key": k}} for k in keys[start : start + 25]]
            for _ in range(10):
                reply = await self.client.batch_write_item(RequestItems={self.table: requests})
                requests = reply.get("UnprocessedItems", {}).get(self.table, [])
                if not requests:
                    break
                await asyncio.sleep(0.05)
        return len(keys)

    # -- leadership -----------------------------------------------------------------

    async def take_authority(self, epoch: int) -> int:
        """A new leader's takeover: raise the authority epoch, fence every head, repair.

        Every head is stamped with ``epoch`` (so writes of older epochs fail),
        and the version record of its current version is (re)written from the
        head itself. Returns the number of tables fenced.
        """
        try:
            await self._call(
                "update_item",
                Key=item_key(META, "authority"),
                UpdateExpression="SET epoch = :epoch",
                ConditionExpression="attribute_exists(pk) AND epoch < :epoch",
                ExpressionAttributeValues={":epoch": n_attr(epoch)},
            )
        except Exception as exc:
            if conditional_failed(exc):
                raise NotLeader(
                    f"epoch {epoch} is not newer than the registry's authority"
                ) from None
            raise
        fenced = 0
        for shard in range(DIR_SHARDS):
            async for head in self._query(f"dir#{shard}"):
                table = TableRef(head["ns"], head["name"])
                try:
                    reply = await self._call(
                        "update_item",
                        Key=dir_key(table),
                        UpdateExpression="SET fence = :epoch",
                        ConditionExpression=(
                            "attribute_exists(pk) AND (attribute_not_exists(fence) OR fence <= :epoch)"
                        ),
                        ExpressionAttributeValues={":epoch": n_attr(epoch)},
                        ReturnValues="ALL_NEW",
                    )
                except Exception as exc:
                    if not conditional_failed(exc):
                        raise
                    if await self._get(dir_key(table)) is None:
                        continue  # dropped meanwhile
                    raise NotLeader(f"a leader newer than epoch {epoch} fenced {table}") from None
                current = decode(reply["Attributes"])
                await self._write_version(
                    head_record(current), current.get("last_op"), current["last_at"]
                )
                fenced += 1
        self._unsynced.clear()
        await self._bump_generation()
        return fenced
