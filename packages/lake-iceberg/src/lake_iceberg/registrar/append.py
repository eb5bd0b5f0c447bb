"""Metadata-only appends of shipped segments, keyed by their object key.

Every append writes the segment's object key into its snapshot summary
(``lake.segment-key``); :func:`committed_keys` rebuilds the registered set
from the table's snapshots. The data file is built here rather than by
``add_files``, which maps statistics by column *name* and so fails on a file
written before a rename: the mapping from Parquet column path to field id
comes from the segment's own schema.
"""

from __future__ import annotations

import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties

from lake_iceberg.registrar.segments import Uploaded

__all__ = ["SEGMENT_KEY", "append_segment", "build_data_file", "committed_keys"]

#: Snapshot summary property naming the segment a snapshot registered.
SEGMENT_KEY = "lake.segment-key"


def committed_keys(table: Table) -> set[str]:
    """Object keys registered by any snapshot the table still has."""
    keys: set[str] = set()
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if summary is None:
            continue
        # `.get`: `key in summary` is always true on pyiceberg's Summary.
        key = summary.additional_properties.get(SEGMENT_KEY)
        if key:
            keys.add(key)
    return keys


def build_data_file(
    table: Table, entry: Uploaded, footer: pq.FileMetaData, segment: Schema
) -> DataFile:
    """The DataFile for ``entry``, statistics keyed by the segment's own field ids."""
    table_schema = table.schema()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(segment, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(segment),
    )
    serialized = statistics.to_serialized_dict()
    # Bounds are encoded in the segment's type; for a column the table has
    # since promoted (int -> long) they would be misread: leave them out.
    for field in segment.fields:
        try:
            current = table_schema.find_field(field.field_id)
        except ValueError:
            continue
        if current.field_type != field.field_type:
            serialized["lower_bounds"].pop(field.field_id, None)
            serialized["upper_bounds"].pop(field.field_id, None)
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=entry.uri,
        file_format=FileFormat.PARQUET,
        partition=statistics.partition(table.metadata.spec(), table_schema),
        file_size_in_bytes=entry.size,
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **serialized,
    )


def _without_retries(table: Table) -> Table:
    """The same table with pyiceberg's own commit retries off, in memory only.

    pyiceberg retries a conflicted append by itself without re-checking the
    segment key; the registrar's own loop reloads and re-checks instead.
    """
    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    metadata = table.metadata.model_copy(update={"properties": properties})
    return Table(
        table.name(),
        metadata=metadata,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
        config=table.config,
    )


def append_segment(table: Table, entry: Uploaded, data_file: DataFile) -> Table:
    """One fast-append commit of ``data_file``; returns the table as committed."""
    target = _without_retries(table)
    transaction = target.transaction()
    with transaction.update_snapshot(
        snapshot_properties={SEGMENT_KEY: entry.object_key}
    ).fast_append() as append:
        append.append_data_file(data_file)
    return transaction.commit_transaction()
