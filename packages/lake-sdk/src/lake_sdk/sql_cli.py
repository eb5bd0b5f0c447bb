"""``lake sql "SELECT ..."``: SQL from a terminal, through the SDK.

Results stream: each record batch is printed as it arrives, so a large
result never has to fit in memory. ``--output table`` (the default) draws
rich tables whose header names every column's type the way every ``lake``
command does (FILE is ``file``); ``json`` prints one JSON array of row
objects; ``csv`` a header line and one line per row (nested values, such as a
FILE column, as JSON text).
"""

from __future__ import annotations

import base64
import csv
import json
import math
import sys
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal, TextIO

import click
import pyarrow as pa

from lake_core.output import type_name
from lake_sdk._cli_connect import connect_timeout_option, open_client

__all__ = ["DEFAULT_QUERY_URL", "json_value", "query_url", "sql"]

DEFAULT_QUERY_URL = "grpc://127.0.0.1:50051"

SqlOutput = Literal["table", "json", "csv"]


def query_url(addr: str) -> str:
    """``--addr`` as a URL: ``host:port`` means plaintext gRPC."""
    return addr if "://" in addr else f"grpc://{addr}"


def json_value(value: Any) -> Any:
    """One cell as JSON: timestamps in RFC 3339, bytes in base64, NaN/inf as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return value


def _rows(batch: pa.RecordBatch) -> Iterator[dict[str, Any]]:
    yield from batch.to_pylist()


def _write_json(batches: Iterator[pa.RecordBatch], out: TextIO) -> None:
    out.write("[")
    first = True
    for batch in batches:
        for row in _rows(batch):
            out.write("\n  " if first else ",\n  ")
            out.write(json.dumps(json_value(row)))
            first = False
    out.write("\n]\n" if not first else "]\n")


def _csv_cell(value: Any) -> Any:
    value = json_value(value)
    return json.dumps(value) if isinstance(value, dict | list) else value


def _write_csv(schema: pa.Schema, batches: Iterator[pa.RecordBatch], out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(schema.names)
    for batch in batches:
        for row in _rows(batch):
            writer.writerow([_csv_cell(row[name]) for name in schema.names])


def _text_cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict | list):
        return json.dumps(json_value(value))
    return str(json_value(value))


def _write_tables(schema: pa.Schema, batches: Iterator[pa.RecordBatch]) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    header = [f"{f.name}\n{type_name(f)}" for f in schema]
    rows = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        # One table per batch: the header on the first only, so output starts at once.
        table = Table(show_header=rows == 0, show_edge=True)
        for title in header:
            table.add_column(title, overflow="fold")
        for row in _rows(batch):
            table.add_row(*(_text_cell(row[name]) for name in schema.names))
        console.print(table)
        rows += batch.num_rows
    if rows == 0:
        console.print(" | ".join(f"{f.name} ({type_name(f)})" for f in schema))
    console.print(f"({rows} row{'s' if rows != 1 else ''})", style="dim")
    return rows


class _StatementCommand(click.Command):
    """A command whose SQL argument may begin with a ``--`` comment.

    click would read ``"-- why\nSELECT 1"`` as an unknown option. An argument
    that starts with ``--`` followed by whitespace, or that spans lines, is
    never an option name: it is passed on as the statement.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        statements = [a for a in args if _is_commented_statement(a)]
        if statements:
            args = [a for a in args if not _is_commented_statement(a)] + ["--", *statements]
        return super().parse_args(ctx, args)


def _is_commented_statement(arg: str) -> bool:
    return arg.startswith("--") and (arg[2:3].isspace() or "\n" in arg)


def read_statement(statement: str | None, file: TextIO | None) -> str:
    """The statement from the argument or from ``-f FILE`` / ``-f -`` (exactly one of them)."""
    if (statement is None) == (file is None):
        raise click.UsageError("give the SQL either as STATEMENT or with -f FILE (-f - for stdin)")
    text = statement if statement is not None else _read_text(file)  # type: ignore[arg-type]
    if not text.strip():
        raise click.UsageError("the SQL statement is empty")
    return text


def _read_text(file: TextIO) -> str:
    """``file``'s text; bytes that are not UTF-8 (a binary file given by mistake) are a usage error."""
    try:
        return file.read()
    except UnicodeDecodeError as exc:
        raise click.BadParameter(
            f"{getattr(file, 'name', 'the file')} is not UTF-8 text (byte {exc.start})",
            param_hint="'--file' / '-f'",
        ) from None


@click.command(cls=_StatementCommand)
@click.argument("statement", required=False)
@click.option(
    "--file",
    "-f",
    "file",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Read the statement from FILE instead (- for standard input).",
)
@click.option(
    "--addr", default=DEFAULT_QUERY_URL, show_default=True, help="Lake Query's URL (not Metasrv's)."
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="table for people; json (one array of row objects) or csv for scripts.",
)
@click.option(
    "--as-of",
    "as_of",
    metavar="V",
    default=None,
    help="Read every lake.<namespace>.<table> the statement names at version V "
    "(3 or v3) or as of an RFC 3339 UTC instant (2026-11-30T12:00:00Z).",
)
@connect_timeout_option
def sql(
    statement: str | None,
    file: TextIO | None,
    addr: str,
    output: SqlOutput,
    as_of: str | None,
    connect_timeout: float | None,
) -> None:
    """Run one read-only SQL STATEMENT on Lake Query and print its rows as they stream.

    The statement may also come from a file or standard input (``-f FILE``,
    ``-f -``), and may start with a ``--`` comment.
    """
    statement = read_statement(statement, file)
    with open_client(query_url(addr), connect_timeout) as client:
        result = client.query(statement, as_of=as_of)
        batches = iter(result)
        if output == "json":
            _write_json(batches, sys.stdout)
        elif output == "csv":
            _write_csv(result.schema, batches, sys.stdout)
        else:
            _write_tables(result.schema, batches)
