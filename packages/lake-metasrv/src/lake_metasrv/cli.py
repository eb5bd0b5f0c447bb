"""``lake meta`` (the server) and ``lake table`` (local administration).

Both parse their whole configuration before touching the data directory.
``lake table`` works directly on a data directory with the same registry and
engine code as the server; it refuses a directory a running server holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import pyarrow as pa
import structlog

from lake_core.admin_cli import index_kind_option
from lake_core.errors import LakeError
from lake_core.filetype import is_file_field
from lake_core.flight.server import FlightServer
from lake_core.integrity import VerifyTableResult, render_report
from lake_core.logs import banner, configure_logging
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_core.schemas import parse_column_spec, validate_table_schema
from lake_core.telemetry import series
from lake_core.telemetry.process import ProcessTelemetry
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import DEFAULT_ADDR, DEFAULT_DATA_DIR, MetaConfig
from lake_metasrv.datadir import DataDir
from lake_metasrv.integrity import verify_table
from lake_metasrv.maintenance import CompactionSettings, Maintenance
from lake_metasrv.registry.base import TableRecord
from lake_metasrv.service import MetaHandler
from lake_metasrv.serving import serve_and_drain, use_io_threads

__all__ = ["configure_logging", "meta", "run_server", "table"]

T = TypeVar("T")
log = structlog.get_logger("lake_metasrv")


class LakeCommandError(click.ClickException):
    exit_code = 2


def _load_config(**kwargs: Any) -> MetaConfig:
    try:
        return MetaConfig.load(**kwargs)
    except LakeError as exc:
        raise LakeCommandError(str(exc)) from None


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
@click.option(
    "--data-dir",
    default=DEFAULT_DATA_DIR,
    show_default=True,
    help="Registry, tables and sidecars live here.",
)
def meta(addr: str, data_dir: str) -> None:
    """Run Metasrv: the registry and the commit authority for native tables."""
    try:
        configure_logging()
        telemetry = ProcessTelemetry.load("lake-meta")
    except LakeError as exc:
        raise LakeCommandError(str(exc)) from None
    config = _load_config(data_dir=data_dir, addr=addr)
    try:
        CompactionSettings.from_env(os.environ)
    except LakeError as exc:
        raise LakeCommandError(str(exc)) from None
    try:
        telemetry.start()  # before the Flight listener binds
        code = asyncio.run(run_server(config))
    except LakeError as exc:
        raise LakeCommandError(str(exc)) from None
    except OSError as exc:
        raise LakeCommandError(str(exc)) from None
    finally:
        telemetry.close()
    sys.exit(code)


# -- lake table ----------------------------------------------------------------------


def _local(data_dir: str, work: Callable[[CommitCoordinator], Awaitable[T]]) -> T:
    configure_logging(logging.WARNING)
    config = _load_config(data_dir=data_dir)
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
        raise LakeCommandError(str(exc)) from None


def _parse_table(name: str) -> TableRef:
    try:
        return TableRef.parse(name)
    except LakeError as exc:
        raise LakeCommandError(str(exc)) from None


def _column(field: pa.Field) -> str:
    return f"{field.name}: {'file' if is_file_field(field) else field.type}"


def _describe(record: TableRecord) -> dict[str, Any]:
    return {
        "table": str(record.table),
        "version": record.version,
        "engine_version": record.engine_version,
        "location": record.location,
        "incarnation": record.incarnation,
        "columns": [_column(f) for f in record.schema],
    }


def _echo(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


@click.group()
def table() -> None:
    """Manage tables in a local data directory (no server needed)."""


_data_dir_option = click.option(
    "--data-dir", default=DEFAULT_DATA_DIR, show_default=True, help="Local Lake data directory."
)


@table.command("create")
@click.argument("name")
@click.option("--column", "columns", multiple=True, required=True, help="name:type, repeatable.")
@_data_dir_option
def create_table(name: str, columns: tuple[str, ...], data_dir: str) -> None:
    """Create NAME (namespace.table) with the given columns."""
    ref = _parse_table(name)
    try:
        schema = validate_table_schema(pa.schema([parse_column_spec(c) for c in columns]))
    except LakeError as exc:
        raise LakeCommandError(str(exc)) from None
    record = _local(data_dir, lambda c: c.create_table(ref, schema))
    _echo(_describe(record))


@table.command("list")
@_data_dir_option
def list_tables(data_dir: str) -> None:
    """List every table with its current version."""

    async def work(c: CommitCoordinator) -> list[TableRecord]:
        _, records = await c.registry.snapshot()
        return records

    _echo([_describe(r) for r in _local(data_dir, work)])


@table.command("describe")
@click.argument("name")
@_data_dir_option
def describe_table(name: str, data_dir: str) -> None:
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

    _echo(_local(data_dir, work))


@table.command("drop")
@click.argument("name")
@_data_dir_option
def drop_table(name: str, data_dir: str) -> None:
    """Drop NAME and delete its dataset."""
    ref = _parse_table(name)
    result = _local(data_dir, lambda c: c.drop_table(ref))
    click.echo(f"dropped {result.table} at version {result.dropped_version}")


@table.command("optimize")
@click.argument("name")
@_data_dir_option
def optimize_table(name: str, data_dir: str) -> None:
    """Compact NAME's small fragments and refresh its indexes (same rows, same version)."""
    ref = _parse_table(name)
    result = _local(data_dir, lambda c: Maintenance(c).compact(ref))
    _echo(result.summary())


@table.command("index")
@click.argument("name")
@click.argument("column")
@index_kind_option
@_data_dir_option
def index_table(name: str, column: str, kind: str, data_dir: str) -> None:
    """Build a scalar index on NAME's COLUMN (key lookups through Query then use it)."""
    ref = _parse_table(name)
    result = _local(data_dir, lambda c: Maintenance(c).create_index(ref, column, kind.upper()))
    _echo(result.summary())


@table.command("verify")
@click.argument("name")
@click.option("--all-versions", is_flag=True, help="Every retained version, not just the current.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@_data_dir_option
def verify_table_command(name: str, all_versions: bool, as_json: bool, data_dir: str) -> None:
    """Recheck size and SHA-256 of every data file of NAME; exit 1 on any mismatch."""
    ref = _parse_table(name)

    async def work(c: CommitCoordinator) -> VerifyTableResult:
        assert c.digests is not None  # a local data directory always records digests
        return await verify_table(c, c.digests, ref, all_versions=all_versions)

    result = _local(data_dir, work)
    click.echo(render_report(result, as_json=as_json))
    if not result.ok:
        sys.exit(1)
