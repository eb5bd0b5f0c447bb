"""``lake table load ns.t FILE.parquet|.csv``: a file's rows as one append, through Query.

The file is streamed (never read whole) through the bulk ingest path
(``client.ingest``: Flight SQL ``CommandStatementIngest``), so any number of
rows becomes ONE table version, or none if anything fails. Its columns must
be exactly the table's, in any order; values are cast to the table's types
(CSV text is parsed as those types), and a value that does not fit is an
``InvalidArgument`` before the commit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_core.filetype import is_file_field
from lake_core.names import TableRef
from lake_core.output import Output, emit, output_option
from lake_sdk._cli_connect import connect_timeout_option, open_client
from lake_sdk.files_cli import addr_option
from lake_sdk.sql_cli import query_url

__all__ = ["SUFFIXES", "file_reader", "table"]

#: The file formats ``load`` reads, by suffix.
SUFFIXES = (".parquet", ".csv")


def _open(path: Path, schema: pa.Schema) -> pa.RecordBatchReader:
    if path.suffix.lower() == ".parquet":
        return _parquet(path)
    import pyarrow.csv as pcsv

    files = [f.name for f in schema if is_file_field(f)]
    if files:
        raise InvalidArgument(f"a CSV file cannot hold FILE column {files[0]!r}; use Parquet")
    types = {f.name: f.type for f in schema}
    return pcsv.open_csv(path, convert_options=pcsv.ConvertOptions(column_types=types))


def _parquet(path: Path) -> pa.RecordBatchReader:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    return pa.RecordBatchReader.from_batches(parquet.schema_arrow, parquet.iter_batches())


def file_reader(path: Path, schema: pa.Schema) -> pa.RecordBatchReader:
    """``path``'s rows as batches of exactly ``schema`` (columns matched by name)."""
    if path.suffix.lower() not in SUFFIXES:
        raise InvalidArgument(f"load reads {' or '.join(SUFFIXES)} files, not {path.name!r}")
    try:
        reader = _open(path, schema)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidArgument(f"cannot read {path.name}: {exc}") from None
    have, want = set(reader.schema.names), set(schema.names)
    if have != want:
        missing, extra = sorted(want - have), sorted(have - want)
        raise InvalidArgument(
            f"{path.name} must have exactly the table's columns"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; not in the table: {', '.join(extra)}" if extra else "")
        )

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for batch in reader:
                yield batch.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidArgument(f"{path.name} does not fit the table: {exc}") from None

    return pa.RecordBatchReader.from_batches(schema, batches())


@click.group()
def table() -> None:
    """Load files into tables through Lake Query."""


@table.command("load")
@click.argument("name", metavar="NAMESPACE.TABLE")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, readable=True))
@addr_option
@connect_timeout_option
@output_option("text")
def load(name: str, path: str, addr: str, connect_timeout: float | None, output: Output) -> None:
    """Append every row of a Parquet or CSV file to a table as ONE new version."""
    ref = TableRef.parse(name)
    with open_client(query_url(addr), connect_timeout) as client:
        schema = client.table_schema(ref)
        reader = file_reader(Path(path), schema)
        rows = 0

        def counted() -> Iterator[pa.RecordBatch]:
            nonlocal rows
            for batch in reader:
                rows += batch.num_rows
                yield batch

        version = client.ingest(ref, pa.RecordBatchReader.from_batches(schema, counted()))
    emit(
        {"table": str(ref), "version": version, "rows": rows},
        output,
        text=f"loaded {rows} rows into {ref} at version {version}",
    )
