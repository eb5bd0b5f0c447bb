"""Bulk ingest: any number of rows as ONE append and one table version.

``append_batches`` keeps the spec's 1..=10,000-row contract; past it,
``client.ingest(table, data)`` streams a pyarrow Table, a RecordBatchReader
or a pandas/polars DataFrame to Query as a Flight SQL ``CommandStatementIngest``
(the same path ADBC's ``adbc_ingest`` takes). Query streams it to Metasrv,
which writes it as it arrives and commits it once (Metasrv's
``LAKE_INGEST_MAX_ROWS`` / ``LAKE_INGEST_MAX_BYTES`` bound it). The stream is
sent in slices of at most :data:`SLICE_BYTES`, so neither side holds it whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from lake_core import protocol
from lake_core.errors import InvalidArgument
from lake_core.ids import parse_operation_id
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2
from lake_core.schemas import SAME_VALUES

__all__ = ["SLICE_BYTES", "as_reader", "ingest_descriptor", "slices"]

#: Largest Arrow slice sent in one Flight message (ADBC's Go client reads up to 16 MiB).
SLICE_BYTES = 4 * 1024 * 1024

_Options = flight_sql_pb2.CommandStatementIngest.TableDefinitionOptions


def as_reader(data: Any, table_schema: pa.Schema | None = None) -> pa.RecordBatchReader:
    """A RecordBatchReader over a Table, a reader, or a pandas / polars DataFrame.

    With ``table_schema``, string and binary columns in another layout of the
    same values (``large_string``, ``string_view``: what polars produces) are
    cast to the table's; every other difference is left for the server's
    exact-schema check.
    """
    reader = _reader(data)
    if table_schema is None:
        return reader
    fields = list(reader.schema)
    changed = False
    for index, field in enumerate(fields):
        if field.name not in table_schema.names:
            continue
        want = table_schema.field(field.name).type
        if field.type in SAME_VALUES.get(want, ()):
            fields[index] = field.with_type(want)
            changed = True
    if not changed:
        return reader
    return reader.cast(pa.schema(fields, metadata=reader.schema.metadata))


def _reader(data: Any) -> pa.RecordBatchReader:
    if isinstance(data, pa.RecordBatchReader):
        return data
    if isinstance(data, pa.Table):
        return data.to_reader()
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatchReader.from_batches(data.schema, [data])
    module = type(data).__module__.split(".", 1)[0]
    if module == "polars" and hasattr(data, "to_arrow"):
        return _reader(data.to_arrow())
    if module == "pandas" and hasattr(data, "columns"):
        return pa.Table.from_pandas(data, preserve_index=False).to_reader()
    raise InvalidArgument(
        "ingest takes a pyarrow Table, RecordBatch or RecordBatchReader, "
        f"or a pandas or polars DataFrame, not {type(data).__name__}"
    )


def slices(reader: pa.RecordBatchReader, limit: int = SLICE_BYTES) -> Iterator[pa.RecordBatch]:
    """The reader's non-empty batches, each cut to at most about ``limit`` bytes."""
    for batch in reader:
        if batch.num_rows == 0:
            continue
        per_row = max(1, batch.nbytes // batch.num_rows)
        step = max(1, limit // per_row)
        for start in range(0, batch.num_rows, step):
            yield batch.slice(start, step)


def ingest_descriptor(table: TableRef, operation_id: str, pack: Any) -> flight.FlightDescriptor:
    """The DoPut descriptor of an append-mode ingest asking for Lake's result (with the version).

    Its stream ends with the end marker (:data:`~lake_core.protocol.INGEST_END_OPTION`),
    so a stream the SDK closes after its reader failed commits nothing.
    """
    parse_operation_id(operation_id)
    command = flight_sql_pb2.CommandStatementIngest(
        table_definition_options=_Options(
            if_not_exist=_Options.TABLE_NOT_EXIST_OPTION_FAIL,
            if_exists=_Options.TABLE_EXISTS_OPTION_APPEND,
        ),
        table=table.name,
        schema=table.namespace,
        options={
            "lake.result": "lake",
            "lake.operation_id": operation_id,
            protocol.INGEST_END_OPTION: protocol.INGEST_END_BY_MARKER,
        },
    )
    return flight.FlightDescriptor.for_command(pack(command))
