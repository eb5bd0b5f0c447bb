"""Durable pending appends: an append's exact operation survives a crash.

With an upload checkpoint directory, the SDK writes the append's UUIDv7
operation id and its encoded Arrow batches (metadata only: never object
bytes or credentials) to ``<dir>/appends/<operation-id>.pending`` and fsyncs
it before the first append RPC. A later process lists them with
:meth:`PendingAppendStore.ids` and replays one exactly with the same id,
which commits at most once.

File format: one JSON header line, then the Arrow IPC stream. The header
names the operation, the table, the IPC length and its SHA-256; a file whose
name, header, length or hash disagree is refused as damaged. Files are at
most 64 MiB of IPC plus a 64 KiB header. Listing reads at most 1,024
directory entries.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pyarrow as pa
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lake_core import faults
from lake_core.durable import fsync_dir, replace_synced
from lake_core.errors import FailedPrecondition, InvalidArgument, LakeError, NotFound
from lake_core.ids import parse_operation_id
from lake_core.names import TableRef
from lake_core.protocol import MAX_APPEND_BYTES

__all__ = [
    "MAX_PENDING_ENTRIES",
    "PendingAppend",
    "PendingAppendDamaged",
    "PendingAppendStore",
    "PendingAppendUncertain",
    "maybe_crash",
]

log = structlog.get_logger("lake_sdk._pending")

APPENDS_DIR = "appends"
SUFFIX = ".pending"
MAX_PENDING_ENTRIES = 1024
MAX_HEADER_BYTES = 64 * 1024
#: IPC framing adds a little to the 64 MiB append payload cap.
MAX_IPC_BYTES = MAX_APPEND_BYTES + 1024 * 1024

#: The SDK's fault points (tests only: ``LAKE_FAULTS=sdk.<point>``, see lake_core.faults).
CRASH_POINTS = {
    "after_pending_write": faults.AFTER_PENDING_WRITE,
    "after_append_commit": faults.AFTER_APPEND_COMMIT,
}


def maybe_crash(point: str) -> None:
    faults.crash(CRASH_POINTS[point])


class PendingAppendDamaged(FailedPrecondition):
    """A pending-append file that is truncated, oversized or altered."""


class PendingAppendUncertain(LakeError):
    """The pending append was renamed into place but its directory could not be synced.

    Do not start a fresh insert: resume ``operation_id`` instead (it may or may
    not survive a crash, but it is the only operation for these rows).
    """

    retryable = True

    def __init__(self, message: str, *, operation_id: str, path: Path) -> None:
        super().__init__(message)
        self.operation_id = operation_id
        self.path = path

    def into_pending_append(self) -> str:
        """The operation id to pass to ``resume_pending_append``."""
        return self.operation_id


class _Header(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["lake.pending_append"] = "lake.pending_append"
    operation_id: str
    table: TableRef
    created_at_ms: int
    ipc_bytes: int = Field(ge=0, le=MAX_IPC_BYTES)
    ipc_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PendingAppend:
    """One recovered append: replay it with its own operation id."""

    operation_id: str
    table: TableRef
    schema: pa.Schema
    batches: list[pa.RecordBatch]
    created_at_ms: int


class PendingAppendStore:
    """The ``appends/`` folder of an upload checkpoint directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser().absolute() / APPENDS_DIR

    def __repr__(self) -> str:
        return f"PendingAppendStore({str(self.directory)!r})"

    def path(self, operation_id: str) -> Path:
        parse_operation_id(operation_id)
        return self.directory / f"{operation_id}{SUFFIX}"

    def write(
        self, operation_id: str, table: TableRef, schema: pa.Schema, batches: list[pa.RecordBatch]
    ) -> Path:
        """Durably record the append before it is sent; raise PendingAppendUncertain if the
        final directory sync failed."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        ipc = sink.getvalue().to_pybytes()
        if len(ipc) > MAX_IPC_BYTES:
            raise InvalidArgument(f"append payload of {len(ipc)} bytes is too large to record")
        header = _Header(
            operation_id=operation_id,
            table=table,
            created_at_ms=int(time.time() * 1000),
            ipc_bytes=len(ipc),
            ipc_sha256=hashlib.sha256(ipc).hexdigest(),
        )
        target = self.path(operation_id)
        fresh = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        if fresh:
            fsync_dir(self.directory.parent)
        replace_synced(target, [header.model_dump_json().encode() + b"\n", ipc], sync_dir=False)
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            raise PendingAppendUncertain(
                f"pending append {operation_id} was written but its directory could not be "
                f"synced ({exc.strerror}); resume it rather than inserting again",
                operation_id=operation_id,
                path=target,
            ) from None
        return target

    def ids(self) -> list[str]:
        """Pending operation ids (oldest first), from at most 1,024 directory entries."""
        found: list[str] = []
        try:
            entries = os.scandir(self.directory)
        except FileNotFoundError:
            return []
        with entries:
            for seen, entry in enumerate(entries, start=1):
                if seen > MAX_PENDING_ENTRIES:
                    log.warning(
                        "pending append discovery stopped at its entry cap",
                        cap=MAX_PENDING_ENTRIES,
                        directory=str(self.directory),
                    )
                    break
                name = entry.name
                if not name.endswith(SUFFIX) or not entry.is_file(follow_symlinks=False):
                    continue
                operation_id = name[: -len(SUFFIX)]
                with contextlib.suppress(LakeError):
                    parse_operation_id(operation_id)
                    found.append(operation_id)
        return sorted(found)

    def load(self, operation_id: str) -> PendingAppend:
        path = self.path(operation_id)
        try:
            with open(path, "rb") as file:
                line = file.readline(MAX_HEADER_BYTES + 1)
                if len(line) > MAX_HEADER_BYTES or not line.endswith(b"\n"):
                    raise PendingAppendDamaged(f"pending append {operation_id} has no valid header")
                try:
                    header = _Header.model_validate_json(line)
                except ValidationError:
                    raise PendingAppendDamaged(
                        f"pending append {operation_id} has a malformed header"
                    ) from None
                ipc = file.read(header.ipc_bytes + 1)
        except FileNotFoundError:
            raise NotFound(f"no pending append {operation_id}") from None
        if header.operation_id != operation_id:
            raise PendingAppendDamaged(f"pending append {operation_id} names another operation")
        if len(ipc) != header.ipc_bytes or hashlib.sha256(ipc).hexdigest() != header.ipc_sha256:
            raise PendingAppendDamaged(f"pending append {operation_id} is truncated or altered")
        try:
            reader = pa.ipc.open_stream(pa.py_buffer(ipc))
            batches = list(reader)
        except (pa.ArrowException, OSError):
            raise PendingAppendDamaged(
                f"pending append {operation_id} holds invalid Arrow data"
            ) from None
        return PendingAppend(
            operation_id, header.table, reader.schema, batches, header.created_at_ms
        )

    def remove(self, operation_id: str) -> None:
        """Forget an append whose outcome is conclusive; failures are only logged."""
        try:
            os.unlink(self.path(operation_id))
            fsync_dir(self.directory)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning(
                "pending append cleanup failed; it stays replay-safe",
                operation_id=operation_id,
                error=exc.strerror,
            )
