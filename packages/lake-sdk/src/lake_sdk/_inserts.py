"""``INSERT INTO ns.table (col, ...) VALUES (?, ...)``: binding rows to one Arrow batch.

Every row is validated against the table schema before the first upload
starts: 1..=10,000 rows, one value per column, FILE columns take a
:class:`~lake_objects.FileUpload`, an existing DataLocation or None, other
columns take plain values Arrow can convert to the column type, and columns
left out must be nullable. Caller metadata (the plain values) and the
DataLocations the uploads will return are capped at 16 MiB each.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_core.filetype import FILE_STRUCT, is_file_field, location_to_row
from lake_core.ids import new_operation_id
from lake_core.models import DataLocation
from lake_core.names import TableRef, validate_identifier
from lake_core.protocol import MAX_APPEND_ROWS
from lake_core.values import check_values
from lake_objects.progress import ProgressCallback
from lake_objects.source import FileUpload
from lake_sdk._appends import Appender
from lake_sdk._files import FileAccess
from lake_sdk._progress import upload_progress

__all__ = [
    "MAX_INSERT_LOCATION_BYTES",
    "MAX_INSERT_METADATA_BYTES",
    "InsertPlan",
    "InsertStatement",
    "insert_rows",
    "parse_insert",
    "plan_insert",
]

MAX_INSERT_METADATA_BYTES = 16 * 1024 * 1024
MAX_INSERT_LOCATION_BYTES = 16 * 1024 * 1024
#: A DataLocation's fixed part: 8-byte size, 64-character hash, offsets.
LOCATION_OVERHEAD_BYTES = 8 + 64 + 16

_INSERT = re.compile(
    r"\s*INSERT\s+INTO\s+(?P<table>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){1,2})"
    r"\s*\((?P<columns>[^()]*)\)\s*VALUES\s*\((?P<values>[^()]*)\)\s*;?\s*",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class InsertStatement:
    table: TableRef
    columns: tuple[str, ...]


def parse_insert(sql: str) -> InsertStatement:
    """Parse the one INSERT form Lake binds; anything else is InvalidArgument."""
    if not isinstance(sql, str):
        raise InvalidArgument("SQL must be a string")
    match = _INSERT.fullmatch(sql)
    if match is None:
        raise InvalidArgument(
            "insert SQL must be INSERT INTO namespace.table (col, ...) VALUES (?, ...)"
        )
    table = TableRef.parse(match.group("table").lower())
    columns = tuple(
        validate_identifier(c.strip().strip('"'), "column name")
        for c in match.group("columns").split(",")
    )
    if len(set(columns)) != len(columns):
        raise InvalidArgument("an insert names a column more than once")
    values = [v.strip() for v in match.group("values").split(",")]
    if any(v != "?" for v in values):
        raise InvalidArgument("insert VALUES must be '?' placeholders; pass the values as params")
    if len(values) != len(columns):
        raise InvalidArgument(
            f"insert names {len(columns)} columns but has {len(values)} placeholders"
        )
    return InsertStatement(table, columns)


@dataclass
class InsertPlan:
    """Validated rows: converted plain columns and the FILE cells still to upload."""

    statement: InsertStatement
    schema: pa.Schema
    rows: int
    arrays: dict[str, pa.Array]
    file_cells: dict[str, list[FileUpload | DataLocation | None]]
    uploads: list[tuple[str, int, FileUpload]] = field(default_factory=list)
    locations: list[DataLocation] = field(default_factory=list)
    metadata_bytes: int = 0

    def projected_location_bytes(self, stage_uri: str) -> int:
        """An upper bound of the DataLocations this insert will carry."""
        uri = len(stage_uri) + len("/objects/") + 36
        total = sum(len(u.media_type) + uri + LOCATION_OVERHEAD_BYTES for _, _, u in self.uploads)
        for loc in self.locations:
            total += len(loc.uri) + len(loc.media_type) + LOCATION_OVERHEAD_BYTES
        return total

    def build(self, uploaded: dict[tuple[str, int], DataLocation]) -> pa.RecordBatch:
        """The one record batch, in the table's column order and exact schema."""
        columns: list[pa.Array] = []
        for table_field in self.schema:
            if table_field.name in self.arrays:
                columns.append(self.arrays[table_field.name])
            elif table_field.name in self.file_cells:
                cells = self.file_cells[table_field.name]
                values: list[dict[str, Any] | None] = []
                for row, cell in enumerate(cells):
                    if isinstance(cell, FileUpload):
                        values.append(location_to_row(uploaded[(table_field.name, row)]))
                    elif isinstance(cell, DataLocation):
                        values.append(location_to_row(cell))
                    else:
                        values.append(None)
                columns.append(pa.array(values, FILE_STRUCT))
            else:
                columns.append(pa.nulls(self.rows, table_field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def plan_insert(
    statement: InsertStatement, schema: pa.Schema, rows: Sequence[Sequence[Any]]
) -> InsertPlan:
    """Validate every row before any upload; raise InvalidArgument naming the first problem."""
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InvalidArgument("insert rows must be a sequence of parameter sequences")
    count = len(rows)
    if not 1 <= count <= MAX_APPEND_ROWS:
        raise InvalidArgument(f"an insert takes 1..={MAX_APPEND_ROWS:,} rows, got {count:,}")
    width = len(statement.columns)
    for index, row in enumerate(rows):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != width:
            raise InvalidArgument(f"row {index} must hold exactly {width} parameter values")
    fields = {f.name: f for f in schema}
    for name in statement.columns:
        if name not in fields:
            raise InvalidArgument(f"{statement.table} has no column {name!r}")
    for table_field in schema:
        if table_field.name not in statement.columns and not table_field.nullable:
            raise InvalidArgument(
                f"column {table_field.name!r} of {statement.table} is not nullable and not inserted"
            )
    plan = InsertPlan(statement, schema, count, {}, {})
    seen_uploads: set[int] = set()
    for position, name in enumerate(statement.columns):
        table_field = fields[name]
        values = [row[position] for row in rows]
        if is_file_field(table_field):
            _file_column(plan, table_field, values, seen_uploads)
        else:
            plan.arrays[name] = _plain_column(statement.table, table_field, values)
            plan.metadata_bytes += plan.arrays[name].get_total_buffer_size()
    if plan.metadata_bytes > MAX_INSERT_METADATA_BYTES:
        raise InvalidArgument(
            f"insert metadata is {plan.metadata_bytes:,} bytes; at most "
            f"{MAX_INSERT_METADATA_BYTES // (1024 * 1024)} MiB per batch"
        )
    return plan


def _file_column(
    plan: InsertPlan, table_field: pa.Field, values: list[Any], seen: set[int]
) -> None:
    cells: list[FileUpload | DataLocation | None] = []
    for row, value in enumerate(values):
        where = f"{table_field.name}[{row}]"
        if value is None:
            if not table_field.nullable:
                raise InvalidArgument(f"{where} is null but the FILE column is not nullable")
        elif isinstance(value, FileUpload):
            if id(value) in seen and not value.resumable:
                raise InvalidArgument(f"{where}: a reader-backed FileUpload can be used only once")
            seen.add(id(value))
            value.validate()
            plan.uploads.append((table_field.name, row, value))
        elif isinstance(value, DataLocation):
            plan.locations.append(value)
        else:
            raise InvalidArgument(
                f"{where} is a FILE column: pass a FileUpload, a DataLocation or None, "
                f"not {type(value).__name__}"
            )
        cells.append(value)
    plan.file_cells[table_field.name] = cells


def _plain_column(table: TableRef, table_field: pa.Field, values: list[Any]) -> pa.Array:
    for row, value in enumerate(values):
        if isinstance(value, FileUpload | DataLocation):
            raise InvalidArgument(
                f"{table_field.name}[{row}] is not a FILE column; it cannot take a file"
            )
        if value is None and not table_field.nullable:
            raise InvalidArgument(
                f"{table_field.name}[{row}] is null but the column is not nullable"
            )
    check_values(table, table_field, values)  # Arrow would truncate 1.5 to 1, 1e39 to inf
    try:
        return pa.array(values, type=table_field.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(
            f"column {table_field.name!r} of {table} cannot hold the given values "
            f"({table_field.type}): {str(exc)[:200]}"
        ) from None


async def insert_rows(
    sql: str,
    rows: Sequence[Sequence[Any]],
    *,
    schema_of: Callable[[TableRef], Awaitable[pa.Schema]],
    files: FileAccess,
    appender: Appender,
    progress: ProgressCallback | bool | None,
) -> int:
    """Validate every row, upload its FileUploads, then append one batch; return the version."""
    statement = parse_insert(sql)
    schema = await schema_of(statement.table)
    plan = plan_insert(statement, schema, rows)
    uploaded: dict[tuple[str, int], DataLocation] = {}
    if plan.uploads or plan.locations:
        store = await files.store()
        for location in plan.locations:
            store.check(location)
        if plan.projected_location_bytes(store.descriptor.uri) > MAX_INSERT_LOCATION_BYTES:
            raise InvalidArgument(
                "the DataLocations of this insert would exceed "
                f"{MAX_INSERT_LOCATION_BYTES // (1024 * 1024)} MiB; split it"
            )
        checkpoint_dir = files.options.upload_checkpoint_dir
        # One upload after another, each with bounded memory; a bar by default on a terminal.
        with upload_progress(progress, files.options.progress) as callback:
            for column, row, upload in plan.uploads:
                uploaded[(column, row)] = await store.upload(
                    upload, checkpoint_dir=checkpoint_dir, progress=callback
                )
    batch = plan.build(uploaded)
    return await appender.append(statement.table, schema, [batch], new_operation_id())
