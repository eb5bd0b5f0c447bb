"""Reading FILE values out of query results."""

from __future__ import annotations

import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_core.models import DataLocation

__all__ = ["data_location"]


def data_location(batch: pa.RecordBatch | pa.Table, column: str, row: int) -> DataLocation:
    """Decode the FILE value at ``batch[column][row]`` into its DataLocation."""
    if column not in batch.schema.names:
        raise InvalidArgument(f"no column {column!r} in the result")
    if not 0 <= row < batch.num_rows:
        raise InvalidArgument(f"row {row} is outside the result's {batch.num_rows} rows")
    value = batch.column(column)[row].as_py()
    if value is None:
        raise InvalidArgument(f"{column}[{row}] is null")
    if not isinstance(value, dict):
        raise InvalidArgument(f"column {column!r} is not a FILE column")
    return DataLocation.model_validate(value)
