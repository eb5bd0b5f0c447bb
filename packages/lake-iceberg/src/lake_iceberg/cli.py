"""``lake segments ...`` and ``lake iceberg ...``: entry points of the ``lake`` root.

``iceberg`` is the plug-in's command group: the registrar lives under it, and
federation commands can join it.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from lake_core.cli import command_error
from lake_core.errors import InvalidArgument
from lake_core.logs import log_format_option
from lake_core.output import Output, emit, output_option

__all__ = ["iceberg", "segments"]


@click.group()
def segments() -> None:
    """Parquet segments: ship them to object storage."""


@segments.command("ship")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--to", "url", required=True, help="s3://bucket/prefix to ship under")
@click.option("--pipeline", required=True, help="pipeline name (the registrar's `pipeline`)")
@click.option(
    "--endpoint",
    default=None,
    help="S3 endpoint URL (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL or AWS)",
)
@output_option("text")
def ship(directory: Path, url: str, pipeline: str, endpoint: str | None, output: Output) -> None:
    """Upload finalized DIRECTORY/<dataset>/<segment>.parquet files and record them."""
    from lake_core.credentials import credential_error
    from lake_core.logs import configure_logging
    from lake_iceberg.registrar.ship import Shipper, s3_client

    configure_logging(logging.INFO)
    client = s3_client(endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or None)
    try:
        report = Shipper(directory, url, pipeline, client).ship()
    except ValueError as exc:
        raise command_error(InvalidArgument(str(exc))) from None
    except Exception as exc:
        missing = credential_error(exc)
        if missing is None:
            raise
        raise missing from None  # the lake root prints it as one line
    emit(
        {"shipped": len(report.shipped), "already_shipped": report.skipped},
        output,
        text=f"shipped {len(report.shipped)}, already shipped {report.skipped}",
    )


@click.group()
def iceberg() -> None:
    """Apache Iceberg: the registrar service."""


@iceberg.command("registrar")
@click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML: a `sinks:` document with one kind: iceberg entry, or its config mapping",
)
@click.option("--once", is_flag=True, help="register what is pending, then exit")
@click.option("--poll", default="5s", show_default=True, help="how often to look for new segments")
@output_option("text")
@log_format_option
def registrar(
    config_file: Path, once: bool, poll: str, output: Output, log_format: str | None
) -> None:
    """Register shipped Parquet segments in Iceberg tables, exactly once."""
    from lake_core.errors import LakeError
    from lake_core.logs import configure_logging
    from lake_core.telemetry.process import ProcessTelemetry
    from lake_iceberg.errors import RegistrarError
    from lake_iceberg.registrar.config import load_config, parse_duration
    from lake_iceberg.registrar.service import Registrar, log

    try:
        configure_logging(logging.INFO, log_format=log_format)
        telemetry = ProcessTelemetry.load("lake-registrar")
    except LakeError as exc:
        raise command_error(exc) from None
    try:
        config = load_config(config_file)
        service = Registrar(config)
        telemetry.start()
        if once:
            progress = service.run_once()
            counts = {
                "registered": progress.registered,
                "skipped": progress.skipped,
                "pending": progress.pending,
                "refused": progress.refused,
            }
            emit(counts, output, text=", ".join(f"{k} {v}" for k, v in counts.items()))
            if progress.refused:
                sys.exit(1)  # segments were refused (logged): the pass did not register all
        else:
            service.run(parse_duration(poll, "--poll"))
    except RegistrarError as error:
        log.error("registrar.fatal", code=error.reason, error=str(error))
        raise
    finally:
        telemetry.close()
