"""``lake recordings``: MCAP recordings as rows of a recordings table.

``create-table`` asks Metasrv (``--meta-addr``) to create the table, as
``lake client create-table`` does; ``add`` and ``extract`` talk to Query
(``--addr``) like ``lake sql``, and upload directly to the stage.
Needs the SDK's ``mcap`` extra (``mcap`` and ``mcap-ros2-support``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import click

from lake_core.auth import METADATA_AUTH_TOKEN_FILE
from lake_core.errors import InvalidArgument, TableExists
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.output import Output, emit, output_option, schema_columns
from lake_core.schemas import schema_from_base64
from lake_core.security import optional_token
from lake_core.tls import METADATA_CA_FILE, METADATA_SERVER_NAME, load_client_tls
from lake_sdk._cli_connect import connect_timeout_option, open_client
from lake_sdk._sync import Client
from lake_sdk.recordings import recordings_schema
from lake_sdk.sql_cli import DEFAULT_QUERY_URL

__all__ = ["parse_assignment", "recordings"]

DEFAULT_META_ADDR = "127.0.0.1:50052"

addr_option = click.option(
    "--addr", default=DEFAULT_QUERY_URL, show_default=True, help="Lake Query's URL (not Metasrv's)."
)


def query_url(addr: str) -> str:
    return addr if "://" in addr else f"grpc://{addr}"


def parse_assignment(text: str) -> tuple[str, str]:
    """``column=value`` of ``--set`` (the value is text; Arrow converts it to the column's type)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise InvalidArgument(f"--set takes column=value, got {text!r}")
    return name.strip(), value


def _typed(client: Client, table: str, assignments: tuple[str, ...]) -> dict[str, Any]:
    """``--set`` values converted to their columns' types (text, numbers, booleans, times)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not assignments:
        return {}
    schema = client.table_schema(table)
    out: dict[str, Any] = {}
    for text in assignments:
        name, value = parse_assignment(text)
        index = schema.get_field_index(name)
        if index < 0:
            raise InvalidArgument(f"{table} has no column {name!r}")
        kind = schema.field(index).type
        if pa.types.is_string(kind):
            out[name] = value
            continue
        try:
            out[name] = pc.cast(pa.array([value]), kind)[0].as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InvalidArgument(f"--set {name}: {value!r} is not a {kind}") from None
    return out


@click.group()
def recordings() -> None:
    """MCAP recordings as rows of a recordings table (the file is a FILE value)."""


@recordings.command("create-table")
@click.argument("table")
@click.option(
    "--column",
    "columns",
    multiple=True,
    help="An extra column name:type, repeatable (utf8, int64, float64, bool, timestamp, ...).",
)
@click.option(
    "--meta-addr",
    default=DEFAULT_META_ADDR,
    show_default=True,
    help="Metasrv's address: tables are created there (credentials from the environment).",
)
@click.option("--if-not-exists", is_flag=True, help="An existing TABLE is shown, not an error.")
@output_option("json")
def create_table(
    table: str, columns: tuple[str, ...], meta_addr: str, if_not_exists: bool, output: Output
) -> None:
    """Create TABLE (namespace.table) with the standard recordings columns plus --column ones."""
    ref = TableRef.parse(table)
    schema = recordings_schema(columns)
    addr = meta_addr if "://" in meta_addr else f"http://{meta_addr}"
    token = optional_token(os.environ, METADATA_AUTH_TOKEN_FILE)
    tls = load_client_tls(os.environ, METADATA_CA_FILE, METADATA_SERVER_NAME)

    async def go() -> Any:
        async with MetaClient(
            addr, token=token, ca_pem=tls.ca_pem, server_name=tls.server_name
        ) as meta:
            try:
                return await meta.create_table(ref, schema)
            except TableExists:
                if not if_not_exists:
                    raise
                return await meta.describe_table(ref)

    entry = asyncio.run(go()).entry
    emit(
        {
            "table": str(entry.table),
            "version": entry.descriptor.version,
            "columns": schema_columns(schema_from_base64(entry.schema_ipc)),
        },
        output,
    )


@recordings.command("add")
@click.argument("table")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="COLUMN=VALUE",
    help="A value for one of the table's own columns, repeatable.",
)
@addr_option
@connect_timeout_option
@output_option("text")
def add(
    table: str,
    files: tuple[Path, ...],
    assignments: tuple[str, ...],
    addr: str,
    connect_timeout: float | None,
    output: Output,
) -> None:
    """Upload each MCAP FILE to the stage and add it to TABLE as one row (one version each)."""
    results = []
    with open_client(query_url(addr), connect_timeout) as client:
        values = _typed(client, table, assignments)
        for path in files:
            added = client.add_recording(table, path, values=values)
            results.append(added.as_json())
            if output == "text":
                click.echo(
                    f"added {added.name} to {added.table} at version {added.version}: "
                    f"{added.summary.message_count} messages on {len(added.summary.topics)} "
                    f"topics, {added.summary.duration_s:.3f} s"
                )
    if output == "json":
        emit(results, output)


@recordings.command("extract")
@click.argument("table")
@click.option("--topic", required=True, help="The topic to decode, such as /joint_states.")
@click.option("--into", "into", required=True, help="The table of its rows (created if missing).")
@click.option("--where", default=None, help="SQL condition on TABLE's rows: which recordings.")
@addr_option
@connect_timeout_option
@click.option(
    "--meta-addr",
    default=DEFAULT_META_ADDR,
    show_default=True,
    help="Metasrv's address: the --into table is created there.",
)
@output_option("text")
def extract(
    table: str,
    topic: str,
    into: str,
    where: str | None,
    addr: str,
    connect_timeout: float | None,
    meta_addr: str,
    output: Output,
) -> None:
    """Decode --topic of every recording of TABLE (--where) into --into: one version each."""
    from lake_sdk.mcap import extract_topic

    token = optional_token(os.environ, METADATA_AUTH_TOKEN_FILE)
    with open_client(query_url(addr), connect_timeout) as client:
        done = extract_topic(
            client, table, topic, into, where=where, meta_addr=meta_addr, meta_token=token
        )
    emit(
        done.as_json(),
        output,
        text=(
            f"extracted {done.rows} {topic} messages of {done.recordings - done.skipped} "
            f"recordings into {done.table} ({done.skipped} already there)"
        ),
    )
