"""Lake's own Flight calls: action names and their versioned JSON bodies.

Actions are ``DoAction(type, body)`` with a JSON body and a single JSON result.
Appends are ``DoPut`` whose descriptor command is an :class:`AppendCommand`,
and whose one ``PutResult`` carries an :class:`AppendResult`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lake_core.errors import InvalidArgument
from lake_core.models import CatalogEntry, TableDescriptor
from lake_core.names import TableRef

__all__ = [
    "APPEND_COMMAND_TYPE",
    "ASYNC_JOB_ID_HEADER",
    "ASYNC_MAX_POLL_WAIT_MS",
    "ASYNC_STATES_HEADER",
    "ASYNC_WAIT_HEADER",
    "INGEST_COMMAND_TYPE",
    "INGEST_END",
    "INGEST_END_BY_MARKER",
    "INGEST_END_OPTION",
    "MAX_APPEND_BYTES",
    "MAX_APPEND_ROWS",
    "MAX_MESSAGE_BYTES",
    "MAX_TABLE_VERSION",
    "AppendCommand",
    "AppendResult",
    "CatalogSnapshotRequest",
    "CatalogSnapshotResult",
    "CreateIndexRequest",
    "CreateTableRequest",
    "DescribeTableResult",
    "DropTableResult",
    "IndexKind",
    "IngestCommand",
    "IngestMode",
    "IngestResult",
    "ListTablesRequest",
    "ListTablesResult",
    "MaintenanceResult",
    "TableRequest",
    "TableVersionRequest",
    "TableVersionResult",
    "WireModel",
    "decode",
    "encode",
]

MAX_APPEND_ROWS = 10_000
MAX_APPEND_BYTES = 64 * 1024 * 1024
#: gRPC message bound of every Lake server and client: room for a 64 MiB DoPut
#: payload plus IPC and protobuf framing.
MAX_MESSAGE_BYTES = 80 * 1024 * 1024

CREATE_TABLE = "lake.create_table"
DROP_TABLE = "lake.drop_table"
DESCRIBE_TABLE = "lake.describe_table"
CATALOG_SNAPSHOT = "lake.catalog_snapshot"
TABLE_SCHEMA = "lake.table_schema"
#: Query: the tables the caller may see, from the replica's catalog cache.
LIST_TABLES = "lake.list_tables"
#: Maintenance: same rows and Lake version, a new physical layout (admin only).
OPTIMIZE_TABLE = "lake.optimize_table"
#: Where a time-travel walk may start (lake_query.planning.version_starts).
TABLE_VERSION = "lake.table_version"
#: The largest table version a request may name (int64).
MAX_TABLE_VERSION = 2**63 - 1
CREATE_INDEX = "lake.create_index"
APPEND_COMMAND_TYPE = "lake.append"
#: A bulk ingest from Query to Metasrv (Flight SQL CommandStatementIngest, forwarded).
INGEST_COMMAND_TYPE = "lake.ingest"
#: Request header of a PollFlightInfo submission: the client's 128-bit job id (32 hex),
#: reused by every retry so a lost reply never runs the SQL twice.
ASYNC_JOB_ID_HEADER = "lake-async-job-id"
#: Request header (value "1") of a Lake client that reads a finished job's state from
#: ``FlightInfo.app_metadata``: a failed or cancelled job then answers the poll instead
#: of failing it, so the poll's own errors (a foreign or tampered handle) stay apart.
ASYNC_STATES_HEADER = "lake-async-states"
#: Request header of a PollFlightInfo of a job handle: wait up to this many milliseconds
#: (decimal) for the job to finish before answering, instead of answering at once. The
#: replica holds at most ``ASYNC_MAX_POLL_WAIT_MS``; without the header a poll never waits.
ASYNC_WAIT_HEADER = "lake-async-wait-ms"
#: The longest a replica holds one poll, whatever the header asks.
ASYNC_MAX_POLL_WAIT_MS = 5_000


class WireModel(BaseModel):
    """A versioned, frozen JSON body."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1


class TableRequest(WireModel):
    table: TableRef


class CreateTableRequest(WireModel):
    table: TableRef
    schema_ipc: str = Field(description="base64 Arrow IPC schema")


class DescribeTableResult(WireModel):
    entry: CatalogEntry


class DropTableResult(WireModel):
    table: TableRef
    dropped_version: int


class CatalogSnapshotRequest(WireModel):
    generation: str | None = None


class CatalogSnapshotResult(WireModel):
    not_modified: bool
    generation: str
    tables: list[CatalogEntry] = Field(default_factory=list)


class ListTablesRequest(WireModel):
    pass


class ListTablesResult(WireModel):
    tables: list[CatalogEntry] = Field(default_factory=list)


class TableVersionRequest(WireModel):
    """One registered version of ``incarnation``, for a walk back through its history.

    Exactly one of ``version`` (that Lake version) and ``after_ms`` (the oldest
    version the registry recorded as committed after that instant, among
    versions ``0..newest``).
    """

    table: TableRef
    incarnation: str = Field(min_length=1, max_length=64)
    # Versions are int64 (t$versions, the registries' columns): a larger one is
    # malformed, not an overflow inside the registry (an Internal error).
    newest: int = Field(ge=0, le=MAX_TABLE_VERSION)
    version: int | None = Field(default=None, ge=0, le=MAX_TABLE_VERSION)
    after_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_selector(self) -> TableVersionRequest:
        if (self.version is None) == (self.after_ms is None):
            raise ValueError("give exactly one of version and after_ms")
        if self.version is not None and self.version > self.newest:
            raise ValueError("version is above newest")
        return self


class TableVersionResult(WireModel):
    """The version found, or neither field (unknown: the caller walks from its head)."""

    version: int | None = Field(default=None, ge=0)
    engine_version: int | None = Field(default=None, ge=1)


IndexKind = Literal["BTREE", "BITMAP"]


class CreateIndexRequest(WireModel):
    table: TableRef
    column: str = Field(min_length=1, max_length=256)
    kind: IndexKind = "BTREE"


class MaintenanceResult(WireModel):
    """The outcome of a maintenance commit: the table's rows and Lake version are unchanged."""

    table: TableRef
    #: False when there was nothing to do (no new Lance version was written).
    changed: bool
    descriptor: TableDescriptor
    previous_engine_version: int
    fragments_before: int
    fragments_after: int
    indexes: list[str] = Field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The result as the CLIs print it (one flat JSON object)."""
        return {
            "table": str(self.table),
            "changed": self.changed,
            "version": self.descriptor.version,
            "engine_version": self.descriptor.engine_version,
            "previous_engine_version": self.previous_engine_version,
            "fragments_before": self.fragments_before,
            "fragments_after": self.fragments_after,
            "indexes": self.indexes,
        }


class AppendCommand(WireModel):
    type: Literal["lake.append"] = "lake.append"
    table: TableRef
    operation_id: str
    read_version: int | None = Field(default=None, ge=0)


class AppendResult(WireModel):
    table: TableRef
    operation_id: str
    version: int
    descriptor: TableDescriptor
    replayed: bool = False


#: ADBC's ingest modes Lake takes (``replace`` is refused: Lake tables only grow).
IngestMode = Literal["append", "create", "create_append"]


class IngestCommand(WireModel):
    """A bulk ingest into an existing table: one stream of any size, one append, one version.

    Its stream ends with a metadata-only FlightData carrying
    :data:`INGEST_END`; a stream cut short any other way commits nothing.
    (Query creates the table first for the ``create`` modes.)
    """

    type: Literal["lake.ingest"] = "lake.ingest"
    table: TableRef
    operation_id: str


#: ``app_metadata`` of the last FlightData of an ingest stream: the sender finished it.
INGEST_END = b"lake.ingest.end"
#: Flight SQL ingest option (``CommandStatementIngest.options``) of a client that ends
#: its stream itself, with value :data:`INGEST_END_BY_MARKER`: its last message is a
#: metadata-only FlightData whose ``app_metadata`` is :data:`INGEST_END`. A stream
#: closed without it was cut short and commits nothing. Without the option (ADBC),
#: Query takes the client's close as the end.
INGEST_END_OPTION = "lake.end"
INGEST_END_BY_MARKER = "marker"


class IngestResult(WireModel):
    table: TableRef
    operation_id: str
    version: int
    rows: int = Field(ge=0)
    created: bool = False
    replayed: bool = False


M = TypeVar("M", bound=BaseModel)


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def decode(model: type[M], data: bytes) -> M:
    """Parse a JSON body, turning any shape error into INVALID_ARGUMENT."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise InvalidArgument(f"malformed {model.__name__}: {where}: {first['msg']}") from None
