"""The FILE half of :class:`~lake_sdk.LakeClient`: inserts with uploads, durable
appends, and direct or Query-issued reads.

State shared by a client and its clones lives in one :class:`ClientState`:
the schema cache, the stage discovery and object store, and the pending
append directory.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa
import structlog

from lake_core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    LakeError,
    NotFound,
    PermissionDenied,
    StaleReadVersion,
    Unimplemented,
)
from lake_core.ids import new_operation_id, parse_operation_id
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects.capability import ReadCapability
from lake_objects.progress import ProgressCallback
from lake_objects.reader import ObjectReader
from lake_objects.store import ManagedObjectStore
from lake_sdk.files import FileAccess, FileOptions
from lake_sdk.inserts import MAX_INSERT_LOCATION_BYTES, parse_insert, plan_insert
from lake_sdk.pending import PendingAppendStore, maybe_crash
from lake_sdk.schema_cache import SchemaCache

__all__ = ["ClientState", "ObjectMethods", "is_conclusive"]

log = structlog.get_logger("lake_sdk")


def is_conclusive(error: LakeError) -> bool:
    """True when the server definitely did not (and will never) commit this operation.

    Explicit rejections are conclusive, including "operation expired" past the
    retention horizon. Transport failures, unknown commit states, timeouts and
    undecodable replies are not: the append may have committed.
    """
    return isinstance(
        error,
        InvalidArgument
        | NotFound
        | AlreadyExists
        | FailedPrecondition
        | PermissionDenied
        | StaleReadVersion
        | Unimplemented,
    )


@dataclass
class ClientState:
    """Everything a client shares with its clones (besides the connection)."""

    schemas: SchemaCache
    files: FileAccess
    pending: PendingAppendStore | None


class ObjectMethods:
    """FILE methods of LakeClient (mixed in; see :mod:`lake_sdk.client`)."""

    _state: ClientState

    async def _action(self, name: str, body: bytes) -> bytes:
        raise NotImplementedError

    async def table_schema(self, table: TableRef | str) -> pa.Schema:
        raise NotImplementedError

    async def _append_with_retries(
        self, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], operation_id: str
    ) -> int:
        raise NotImplementedError

    # -- schema cache --------------------------------------------------------------

    def invalidate_table_schema(self, table: TableRef | str) -> None:
        """Forget one cached schema (e.g. after the table was replaced)."""
        self._state.schemas.invalidate(_ref(table))

    def clear_schema_cache(self) -> None:
        self._state.schemas.clear()

    # -- stage ---------------------------------------------------------------------

    async def object_store(self) -> ManagedObjectStore:
        """This client's managed store (discovered through Query once, shared by clones)."""
        return await self._state.files.store()

    # -- durable appends -----------------------------------------------------------

    async def _durable_append(
        self, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], operation_id: str
    ) -> int:
        pending = self._state.pending
        if pending is not None:
            await asyncio.to_thread(pending.write, operation_id, table, schema, batches)
            maybe_crash("after_pending_write")
        return await self._finish_append(table, schema, batches, operation_id)

    async def _finish_append(
        self, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch], operation_id: str
    ) -> int:
        pending = self._state.pending
        try:
            version = await self._append_with_retries(table, schema, batches, operation_id)
        except LakeError as error:
            if pending is not None and is_conclusive(error):
                pending.remove(operation_id)
            elif pending is not None:
                log.warning(
                    "append outcome unknown; resume it with resume_pending_append",
                    operation_id=operation_id,
                    error=type(error).__name__,
                )
            error.operation_id = operation_id  # type: ignore[attr-defined]
            raise
        maybe_crash("after_append_commit")
        if pending is not None:
            pending.remove(operation_id)
        return version

    async def pending_append_ids(self) -> list[str]:
        """Operation ids of appends whose outcome a crash left unknown (at most 1,024)."""
        if self._state.pending is None:
            return []
        return await asyncio.to_thread(self._state.pending.ids)

    async def resume_pending_append(self, operation_id: str) -> int:
        """Replay one pending append with its own operation id; returns the committed version.

        Commits at most once: if the first attempt committed, the server returns
        that version. A conclusive rejection (including an expired operation)
        removes the pending file and raises.
        """
        parse_operation_id(operation_id)
        if self._state.pending is None:
            raise FailedPrecondition("pending appends need an upload checkpoint directory")
        recovered = await asyncio.to_thread(self._state.pending.load, operation_id)
        return await self._finish_append(
            recovered.table, recovered.schema, recovered.batches, operation_id
        )

    # -- inserts -------------------------------------------------------------------

    async def insert(
        self, sql: str, params: Sequence[Any], *, progress: ProgressCallback | None = None
    ) -> int:
        """``INSERT INTO ns.table (cols) VALUES (?, ...)`` with one row; returns the version."""
        return await self.insert_many(sql, [params], progress=progress)

    async def insert_many(
        self,
        sql: str,
        rows: Sequence[Sequence[Any]],
        *,
        progress: ProgressCallback | None = None,
    ) -> int:
        """Insert 1..=10,000 rows as one append and one table version.

        ``FileUpload`` parameters stream straight to the managed stage first
        (one after another, each with bounded memory); only their DataLocations
        enter the batch. Every row is validated before the first upload.
        """
        statement = parse_insert(sql)
        schema = await self.table_schema(statement.table)
        plan = plan_insert(statement, schema, rows)
        uploaded: dict[tuple[str, int], DataLocation] = {}
        if plan.uploads or plan.locations:
            store = await self._state.files.store()
            for location in plan.locations:
                store.check(location)
            if plan.projected_location_bytes(store.descriptor.uri) > MAX_INSERT_LOCATION_BYTES:
                raise InvalidArgument(
                    "the DataLocations of this insert would exceed "
                    f"{MAX_INSERT_LOCATION_BYTES // (1024 * 1024)} MiB; split it"
                )
            callback = progress or self._state.files.options.progress
            checkpoint_dir = self._state.files.options.upload_checkpoint_dir
            for column, row, upload in plan.uploads:
                uploaded[(column, row)] = await store.upload(
                    upload, checkpoint_dir=checkpoint_dir, progress=callback
                )
        batch = plan.build(uploaded)
        return await self._durable_append(statement.table, schema, [batch], new_operation_id())

    # -- reads ---------------------------------------------------------------------

    async def open(self, location: DataLocation) -> ObjectReader:
        """Stream an object directly from storage; EOF proves its size and SHA-256."""
        return await self._state.files.open(location)

    async def open_range(self, location: DataLocation, start: int, end: int) -> ObjectReader:
        """Exactly bytes ``start..end`` (half-open) of an object, directly from storage."""
        return await self._state.files.open_range(location, start, end)

    async def presign_read(self, location: DataLocation, ttl: float | timedelta) -> ReadCapability:
        """A presigned GET (1 s..=1 h) signed with this process's credentials (S3 only)."""
        return await self._state.files.presign_read(location, ttl)

    async def open_via_query(self, location: DataLocation, ttl: float | timedelta) -> ObjectReader:
        """Read through a capability Query signs (needs no storage credentials here)."""
        return await self._state.files.open_via_query(location, ttl)

    async def open_range_via_query(
        self, location: DataLocation, start: int, end: int, ttl: float | timedelta
    ) -> ObjectReader:
        return await self._state.files.open_range_via_query(location, start, end, ttl)

    async def presign_read_via_query(
        self, location: DataLocation, ttl: float | timedelta
    ) -> ReadCapability:
        """The capability itself: a bearer URL and headers; never log them."""
        return await self._state.files.presign_read_via_query(location, ttl)

    async def cancel_upload(self, path: str | os.PathLike[str]) -> bool:
        """Abort the checkpointed upload of ``path`` (and delete its checkpoint)."""
        directory = self._state.files.options.upload_checkpoint_dir
        if directory is None:
            return False
        return await (await self.object_store()).cancel_upload(path, directory)


def _ref(table: TableRef | str) -> TableRef:
    return table if isinstance(table, TableRef) else TableRef.parse(table)


def new_state(
    files: FileOptions,
    action: Any,
    *,
    schema_cache_capacity: int,
    schema_cache_ttl_s: float,
) -> ClientState:
    return ClientState(
        schemas=SchemaCache(schema_cache_capacity, schema_cache_ttl_s),
        files=FileAccess(files, action),
        pending=(
            PendingAppendStore(files.upload_checkpoint_dir)
            if files.upload_checkpoint_dir is not None
            else None
        ),
    )
