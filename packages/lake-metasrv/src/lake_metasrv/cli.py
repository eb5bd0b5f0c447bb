"""``lake meta`` (the server) and ``lake table`` (local administration).

Both parse their whole configuration before touching the data directory.
``lake table`` works directly on a data directory with the same registry and
engine code as the server; it refuses a directory a running server holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import pyarrow as pa
import structlog

from lake_core.admin_cli import (
    column_option,
    if_not_exists_option,
    index_kind_option,
    json_flag_option,
)
from lake_core.cli import EXIT_REFUSED, command_error, data_dir_option
from lake_core.errors import LakeError, TableExists, TableNotFound
from lake_core.flight.server import FlightServer
from lake_core.integrity import VerifyTableResult, render_report
from lake_core.logs import banner, configure_logging, log_format_option
from lake_core.names import TableRef
from lake_core.output import Output, emit, output_option, schema_columns
from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_core.schemas import parse_column_spec, validate_table_schema
from lake_core.startup import run_process
from lake_core.telemetry import series
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import DEFAULT_ADDR, DEFAULT_DATA_DIR, MetaConfig
from lake_metasrv.datadir import DataDir
from lake_metasrv.digests.verify import verify_table
from lake_metasrv.maintenance import CompactionSettings, Maintenance
from lake_metasrv.registry.base import TableRecord
from lake_metasrv.service import MetaHandler
from lake_metasrv.serving import serve_and_drain, use_io_threads
from lake_objects.progress import TaskBars

__all__ = ["configure_logging", "meta", "run_server", "table"]

T = TypeVar("T")
log = structlog.get_logger("lake_metasrv")


class LakeCommandError(click.ClickException):
    """A refused ``lake table``/``meta`` command (a Lake error raises ``command_error``)."""

    exit_code = EXIT_REFUSED


def _load_config(**kwargs: Any) -> MetaConfig:
    try:
        return MetaConfig.load(**kwargs)
    except LakeError as exc:
        raise command_error(exc) from None


def loopback_principal(metadata: object, peer: str, method: str) -> Principal:
    """Anonymous callers on the (loopback-only) plaintext listener."""
    return DEV_PRINCIPAL


# -- lake meta ---------------------------------------------------------------------


async def run_server(
    config: MetaConfig,
    *,
    stop: asyncio.Event | None = None,
    on_started: Callable[[FlightServer], object] | None = None,
) -> int:
    """Serve Metasrv until SIGINT/SIGTERM or ``stop``; return the process exit code."""
    if config.cloud is not None:
        from lake_metasrv.cloud import run_cloud_server

        return await run_cloud_server(config, stop=stop, on_started=on_started)
    use_io_threads()
    data_dir = DataDir(config.data_dir)
    data_dir.lock()
    coordinator = CommitCoordinator.local(config)
    series.LEADER.set(1)  # a local Metasrv is the only writer of its data directory
    try:
        await coordinator.open()

        def started(server: FlightServer) -> None:
            bound = f"{config.addr.rpartition(':')[0]}:{server.port}"
            log.info(
                "metasrv serving",
                addr=bound,
                tls=config.security.tls is not None,
                authenticator=repr(config.security.authenticator),
                data_dir=str(config.data_dir),
                retain_versions=config.retain_versions,
            )
            banner(f"lake meta listening on {bound}")
            if on_started is not None:
                on_started(server)

        clean = await serve_and_drain(
            MetaHandler(coordinator), coordinator, config, on_started=started, stop=stop
        )
        return 0 if clean else 1
    finally:
        # Already drained above (bounded by the grace); do not wait again.
        await coordinator.close(drain_timeout_s=0.1)
        data_dir.unlock()


@click.command()
@click.option("--addr", default=DEFAULT_ADDR, show_default=True, help="Loopback host:port.")
@data_dir_option(DEFAULT_DATA_DIR, "Registry, tables and sidecars live here")
@log_format_option
def meta(addr: str, data_dir: str, log_format: str | None) -> None:
    """Run Metasrv: the registry and the commit authority for native tables."""

    def load() -> MetaConfig:
        config = _load_config(data_dir=data_dir, addr=addr)
        CompactionSettings.from_env(os.environ)
        return config

    try:
        code = run_process("lake-meta", load=load, serve=run_server, log_format=log_format)
    except (LakeError, OSError) as exc:
        raise command_error(exc) from None
    sys.exit(code)


# -- lake table ----------------------------------------------------------------------


def _local(
    data_dir: str,
    work: Callable[[CommitCoordinator], Awaitable[T]],
    *,
    create: bool = False,
    table: TableRef | None = None,
) -> T:
    """Run ``work`` on the local data directory; only ``create`` may start a new one."""
    configure_logging(logging.WARNING)
    config = _load_config(data_dir=data_dir)
    if not create and config.cloud is None and not config.data_dir.is_dir():
        # A typo in --data-dir must not leave an empty Lake behind and print "[]".
        missing = (
            f"no Lake data directory at {config.data_dir}: pass the --data-dir that "
            "`lake meta` or `lake table create` used"
        )
        raise LakeCommandError(missing if table is None else f"{TableNotFound(table)}; {missing}")
    if config.cloud is not None:
        # Only the elected Metasrv leader commits in cloud mode.
        raise LakeCommandError(
            "lake table works on a local data directory; in cloud mode (LAKE_CLOUD_MODE=true) "
            "use `lake client --addr <metasrv>` so the Metasrv leader makes the change"
        )

    async def go() -> T:
        coordinator = CommitCoordinator.local(config)
        with DataDir(config.data_dir):
            await coordinator.open()
            try:
                return await work(coordinator)
            finally:
                await coordinator.close()

    try:
        return asyncio.run(go())
    except LakeError as exc:
        raise command_error(exc) from None


def _parse_table(name: str) -> TableRef:
    try:
        return TableRef.parse(name)
    except LakeError as exc:
        raise command_error(exc) from None


def _describe(record: TableRecord) -> dict[str, Any]:
    return {
        "table": str(record.table),
        "version": record.version,
        "engine_version": record.engine_version,
        "location": record.location,
        "incarnation": record.incarnation,
        "columns": schema_columns(record.schema),
    }


@click.group()
def table() -> None:
    """Manage tables in a local data directory (no server needed)."""


_data_dir_option = data_dir_option(DEFAULT_DATA_DIR, "Local Lake data directory")


@table.command("create")
@click.argument("name")
@column_option
@if_not_exists_option
@_data_dir_option
@output_option("json")
def create_table(
    name: str, columns: tuple[str, ...], if_not_exists: bool, data_dir: str, output: Output
) -> None:
    """Create NAME (namespace.table) with the given columns."""
    ref = _parse_table(name)
    try:
        schema = validate_table_schema(pa.schema([parse_column_spec(c) for c in columns]))
    except LakeError as exc:
        raise command_error(exc) from None

    async def create(c: CommitCoordinator) -> TableRecord:
        try:
            return await c.create_table(ref, schema)
        except TableExists:
            if not if_not_exists:
                raise
            return await c.describe_table(ref)

    record = _local(data_dir, create, create=True)
    emit(_describe(record), output)


@table.command("list")
@_data_dir_option
@output_option("json")
def list_tables(data_dir: str, output: Output) -> None:
    """List every table with its current version."""

    async def work(c: CommitCoordinator) -> list[TableRecord]:
        _, records = await c.registry.snapshot()
        return records

    emit([_describe(r) for r in _local(data_dir, work)], output)


@table.command("describe")
@click.argument("name")
@_data_dir_option
@output_option("json")
def describe_table(name: str, data_dir: str, output: Output) -> None:
    """Show NAME's schema, current version and version history."""
    ref = _parse_table(name)

    async def work(c: CommitCoordinator) -> dict[str, Any]:
        record = await c.describe_table(ref)
        history = await c.registry.versions(record.incarnation)
        return {
            **_describe(record),
            "versions": [
                {"version": v.version, "engine_version": v.engine_version} for v in history
            ],
        }

    emit(_local(data_dir, work, table=ref), output)


@table.command("drop")
@click.argument("name")
@_data_dir_option
@output_option("text")
def drop_table(name: str, data_dir: str, output: Output) -> None:
    """Drop NAME and delete its dataset."""
    ref = _parse_table(name)
    result = _local(data_dir, lambda c: c.drop_table(ref), table=ref)
    emit(
        {"table": str(result.table), "dropped_version": result.dropped_version},
        output,
        text=f"dropped {result.table} at version {result.dropped_version}",
    )


@table.command("optimize")
@click.argument("name")
@_data_dir_option
@output_option("json")
def optimize_table(name: str, data_dir: str, output: Output) -> None:
    """Compact NAME's small fragments and refresh its indexes (same rows, same version)."""
    ref = _parse_table(name)
    result = _local(data_dir, lambda c: Maintenance(c).compact(ref), table=ref)
    emit(result.summary(), output)


@table.command("index")
@click.argument("name")
@click.argument("column")
@index_kind_option
@_data_dir_option
@output_option("json")
def index_table(name: str, column: str, kind: str, data_dir: str, output: Output) -> None:
    """Build a scalar index on NAME's COLUMN (key lookups through Query then use it)."""
    ref = _parse_table(name)
    result = _local(
        data_dir, lambda c: Maintenance(c).create_index(ref, column, kind.upper()), table=ref
    )
    emit(result.summary(), output)


@table.command("verify")
@click.argument("name")
@click.option("--all-versions", is_flag=True, help="Every retained version, not just the current.")
@json_flag_option
@_data_dir_option
@output_option("text")
def verify_table_command(
    name: str, all_versions: bool, as_json: bool, data_dir: str, output: Output
) -> None:
    """Recheck size and SHA-256 of every data file of NAME; exit 1 on any mismatch."""
    ref = _parse_table(name)

    # A bar on an interactive terminal (not with LAKE_NO_PROGRESS=1); the report stays on stdout.
    with TaskBars(unit="items") as bars:

        def advance(done: int, total: int) -> None:
            bars.update(f"verify {ref}", done, total, finished=done == total)

        async def work(c: CommitCoordinator) -> VerifyTableResult:
            assert c.digests is not None  # a local data directory always records digests
            return await verify_table(
                c, c.digests, ref, all_versions=all_versions, progress=advance
            )

        result = _local(data_dir, work, table=ref)
    click.echo(render_report(result, as_json=as_json or output == "json"))
    if not result.ok:
        sys.exit(1)
