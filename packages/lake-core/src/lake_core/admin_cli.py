"""``lake client``: administrative commands against a running Metasrv.

Credentials and TLS come from the environment, never flags:
``LAKE_METADATA_AUTH_TOKEN_FILE`` (an admin token on Metasrv's map),
``LAKE_METADATA_CA_FILE`` and ``LAKE_METADATA_SERVER_NAME`` (with an
``https://`` ``--addr``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar, get_args

import click
import pyarrow as pa

from lake_core.auth import METADATA_AUTH_TOKEN_FILE
from lake_core.cli import command_error
from lake_core.errors import LakeError, TableExists, Unavailable, Unimplemented
from lake_core.integrity import (
    VERIFY_TABLE,
    VerifyTableRequest,
    VerifyTableResult,
    render_report,
)
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.output import Output, emit, output_option, render_json, schema_columns
from lake_core.protocol import IndexKind
from lake_core.schemas import parse_column_spec, schema_from_base64, validate_table_schema
from lake_core.security import optional_token
from lake_core.status import STATUS, MetasrvStatus, QueryStatus, StatusRequest
from lake_core.tls import METADATA_CA_FILE, METADATA_SERVER_NAME, load_client_tls

T = TypeVar("T")

#: ``--kind`` of an index command: one of :data:`lake_core.protocol.IndexKind`
#: (shown and defaulted in lowercase, as the choices are listed; any case is accepted).
index_kind_option = click.option(
    "--kind",
    type=click.Choice([k.lower() for k in get_args(IndexKind)], case_sensitive=False),
    default="btree",
    show_default=True,
    help="Scalar index kind.",
)

#: ``--column name:type`` of a create command, naming every type it accepts.
column_option = click.option(
    "--column",
    "columns",
    multiple=True,
    required=True,
    help=(
        "name:type, repeatable. Types: utf8 (alias string), int32, int64, float32, "
        "float64, bool, timestamp (microseconds, UTC), binary, file."
    ),
)

#: ``--if-not-exists`` of a create command: an existing table is described, not an error
#: (so scripts and tutorials can run twice).
if_not_exists_option = click.option(
    "--if-not-exists",
    is_flag=True,
    help="If TABLE already exists, show it and succeed (its columns are left as they are).",
)

#: Maintenance rewrites data: allow it far longer than a metadata call.
MAINTENANCE_TIMEOUT_S = 3600.0


def _client(addr: str, timeout_s: float = 30.0) -> MetaClient:
    try:
        token = optional_token(os.environ, METADATA_AUTH_TOKEN_FILE)
        tls = load_client_tls(os.environ, METADATA_CA_FILE, METADATA_SERVER_NAME)
    except LakeError as exc:
        raise command_error(exc) from None
    return MetaClient(
        addr, token=token, ca_pem=tls.ca_pem, server_name=tls.server_name, timeout_s=timeout_s
    )


#: How long a command waits for Metasrv to answer (started a moment ago, restarting,
#: failing over): a tutorial that starts ``lake meta &`` and runs ``lake client``
#: next works pasted whole.
CONNECT_WAIT_S = 30.0


def _run(addr: str, call: Any, timeout_s: float = 30.0) -> Any:
    async def go() -> Any:
        async with _client(addr, timeout_s) as client:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + CONNECT_WAIT_S
            delay = 0.05
            while True:
                try:
                    result: Awaitable[Any] = call(client)
                    return await result
                except Unavailable:
                    if loop.time() + delay > deadline:
                        raise
                    if delay == 0.05:
                        click.echo(f"waiting for Metasrv at {addr} ...", err=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    try:
        return asyncio.run(go())
    except Unimplemented as exc:
        # Every action these commands send is Metasrv's: another service answered.
        raise Unimplemented(
            f"{exc}; `lake client --addr` takes Metasrv's address "
            f"(lake meta --addr, 127.0.0.1:50052 by default), and {addr} is not it"
        ) from None


def _describe(entry: Any) -> dict[str, Any]:
    schema = schema_from_base64(entry.schema_ipc)
    return {
        "table": str(entry.table),
        "version": entry.descriptor.version,
        "location": entry.descriptor.location,
        "incarnation": entry.descriptor.incarnation,
        "columns": schema_columns(schema),
    }


@click.group()
@click.option("--addr", default="127.0.0.1:50052", show_default=True, help="Metasrv address.")
@click.pass_context
def client(ctx: click.Context, addr: str) -> None:
    """Administer tables on a running Metasrv."""
    ctx.obj = addr if "://" in addr else f"http://{addr}"


@client.command("create-table")
@click.argument("table")
@column_option
@if_not_exists_option
@output_option("json")
@click.pass_obj
def create_table(
    addr: str, table: str, columns: tuple[str, ...], if_not_exists: bool, output: Output
) -> None:
    """Create TABLE (namespace.table) with the given columns."""
    ref = TableRef.parse(table)
    schema = validate_table_schema(pa.schema([parse_column_spec(c) for c in columns]))

    async def create(c: MetaClient) -> Any:
        try:
            return await c.create_table(ref, schema)
        except TableExists:
            if not if_not_exists:
                raise
            return await c.describe_table(ref)

    result = _run(addr, create)
    emit(_describe(result.entry), output)


@client.command("describe-table")
@click.argument("table")
@output_option("json")
@click.pass_obj
def describe_table(addr: str, table: str, output: Output) -> None:
    """Show TABLE's current version and schema."""
    ref = TableRef.parse(table)
    result = _run(addr, lambda c: c.describe_table(ref))
    emit(_describe(result.entry), output)


@client.command("drop-table")
@click.argument("table")
@output_option("text")
@click.pass_obj
def drop_table(addr: str, table: str, output: Output) -> None:
    """Drop TABLE."""
    ref = TableRef.parse(table)
    result = _run(addr, lambda c: c.drop_table(ref))
    emit(
        {"table": str(result.table), "dropped_version": result.dropped_version},
        output,
        text=f"dropped {result.table} at version {result.dropped_version}",
    )


@client.command("list-tables")
@output_option("json")
@click.pass_obj
def list_tables(addr: str, output: Output) -> None:
    """List every table with its current version (as ``lake table list``)."""
    result = _run(addr, lambda c: c.catalog_snapshot(None))
    emit([_describe(e) for e in sorted(result.tables, key=lambda e: str(e.table))], output)


@client.command("optimize-table")
@click.argument("table")
@output_option("json")
@click.pass_obj
def optimize_table(addr: str, table: str, output: Output) -> None:
    """Compact TABLE's small fragments and refresh its indexes (same rows, same version)."""
    ref = TableRef.parse(table)
    result = _run(addr, lambda c: c.optimize_table(ref), MAINTENANCE_TIMEOUT_S)
    emit(result.summary(), output)


@client.command("create-index")
@click.argument("table")
@click.argument("column")
@index_kind_option
@output_option("json")
@click.pass_obj
def create_index(addr: str, table: str, column: str, kind: str, output: Output) -> None:
    """Build a scalar index on TABLE's COLUMN (Query's key lookups then use it)."""
    ref = TableRef.parse(table)
    result = _run(addr, lambda c: c.create_index(ref, column, kind.upper()), MAINTENANCE_TIMEOUT_S)
    emit(result.summary(), output)


#: ``--json`` of the verify commands: the 0.1 spelling of ``--output json``.
json_flag_option = click.option(
    "--json", "as_json", is_flag=True, help="Same as --output json (kept from 0.1)."
)


@client.command("verify-table")
@click.argument("table")
@click.option("--all-versions", is_flag=True, help="Every retained version, not just the current.")
@json_flag_option
@output_option("text")
@click.pass_obj
def verify_table(addr: str, table: str, all_versions: bool, as_json: bool, output: Output) -> None:
    """Recheck size and SHA-256 of every data file of TABLE; exit 1 on any mismatch."""
    request = VerifyTableRequest(table=TableRef.parse(table), all_versions=all_versions)
    result = _run(
        addr,
        lambda c: c.action(VERIFY_TABLE, request, VerifyTableResult),
        MAINTENANCE_TIMEOUT_S,
    )
    click.echo(render_report(result, as_json=as_json or output == "json"))
    if not result.ok:
        sys.exit(1)


def _url(addr: str) -> str:
    return addr if "://" in addr else f"http://{addr}"


async def _ask(addr: str, result: type[Any]) -> dict[str, Any]:
    try:
        async with _client(addr, timeout_s=10.0) as c:
            answer = await c.action(STATUS, StatusRequest(), result)
    except LakeError as exc:
        # The class, not the text, tells an operator what happened; the text helps.
        return {"addr": addr, "error": type(exc).__name__, "message": str(exc)[:200]}
    return {"addr": addr, **answer.model_dump(exclude={"schema_version"})}


@client.command("status")
@click.option("--node", "nodes", multiple=True, help="Another Metasrv node to ask (repeatable).")
@click.option("--query", "queries", multiple=True, help="A Query replica to ask (repeatable).")
@json_flag_option
@output_option("text")
@click.pass_obj
def status(
    addr: str, nodes: tuple[str, ...], queries: tuple[str, ...], as_json: bool, output: Output
) -> None:
    """Each Metasrv node's role, epoch and lease; each Query replica's admission figures."""

    async def gather() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        metas = await asyncio.gather(*(_ask(a, MetasrvStatus) for a in [addr, *map(_url, nodes)]))
        replicas = await asyncio.gather(*(_ask(_url(q), QueryStatus) for q in queries))
        return list(metas), list(replicas)

    metas, replicas = asyncio.run(gather())
    leaders = {m["advertised_url"] or m["addr"] for m in metas if m.get("role") == "leader"}
    leaders |= {m["leader_url"] for m in metas if m.get("role") == "follower" and m["leader_url"]}
    report = {"leader": sorted(leaders)[0] if len(leaders) == 1 else None}
    report |= {"metasrv": metas, "query": replicas}
    if as_json or output == "json":
        click.echo(render_json(report))
    else:
        click.echo(f"leader: {report['leader'] or 'unknown'}")
        for m in metas:
            if "error" in m:
                click.echo(f"metasrv {m['addr']}: {m['error']}: {m['message']}")
                continue
            click.echo(
                f"metasrv {m['addr']}: {m['role']} epoch {m['epoch']} lease "
                f"{m['lease_expires_in_ms']} ms, advertised {m['advertised_url'] or '-'}, "
                f"version {m['version']}"
            )
        for q in replicas:
            if "error" in q:
                click.echo(f"query {q['addr']}: {q['error']}: {q['message']}")
                continue
            a = q["admission"]
            health = (
                "serving" if q["serving"] else "NOT serving (" + ", ".join(q["not_serving"]) + ")"
            )
            memory = q.get("memory")
            used = (
                ""
                if memory is None
                else f", memory {memory['reserved_bytes'] >> 20}/{memory['limit_bytes'] >> 20} MiB"
            )
            click.echo(
                f"query {q['addr']}: {health}, running {a['running']}/{a['max_concurrent']}, "
                f"queued {a['queued']}, refused {a['refused_total']}{used}, "
                f"{q['catalog_tables']} tables, version {q['version']}"
            )
    if any("error" in m for m in [*metas, *replicas]):
        sys.exit(1)
