"""``lake import lerobot DIR`` and ``lake export lerobot SQL OUT_DIR`` (lake_sdk.lerobot)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from lake_core.auth import METADATA_AUTH_TOKEN_FILE
from lake_core.output import Output, emit, output_option
from lake_core.security import optional_token
from lake_sdk._cli_connect import connect_timeout_option, open_client
from lake_sdk.lerobot import export_lerobot, import_lerobot
from lake_sdk.recordings_cli import DEFAULT_META_ADDR, addr_option, query_url

__all__ = ["export_group", "import_group"]


@click.group("import")
def import_group() -> None:
    """Import datasets of other formats into Lake tables."""


@import_group.command("lerobot")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--namespace", required=True, help="Namespace of the three new tables.")
@click.option("--name", default=None, help="Table name prefix (default: the directory's name).")
@addr_option
@connect_timeout_option
@click.option(
    "--meta-addr",
    default=DEFAULT_META_ADDR,
    show_default=True,
    help="Metasrv's address: the tables are created there.",
)
@output_option("text")
def lerobot(
    directory: Path,
    namespace: str,
    name: str | None,
    addr: str,
    connect_timeout: float | None,
    meta_addr: str,
    output: Output,
) -> None:
    """Import the LeRobot v3.0 dataset DIRECTORY as NAME_frames, NAME_episodes, NAME_tasks."""
    token = optional_token(os.environ, METADATA_AUTH_TOKEN_FILE)
    with open_client(query_url(addr), connect_timeout) as client:
        done = import_lerobot(
            client,
            directory,
            namespace=namespace,
            name=name,
            meta_addr=meta_addr,
            meta_token=token,
        )
    emit(
        done.as_json(),
        output,
        text=(
            f"imported {done.episode_count} episodes ({done.frame_count} frames, "
            f"{done.videos_uploaded} videos uploaded) into {done.frames}, {done.episodes}, "
            f"{done.tasks}"
        ),
    )


@click.group("export")
def export_group() -> None:
    """Export Lake tables as datasets of other formats."""


@export_group.command("lerobot")
@click.argument("statement")
@click.argument("out_dir", type=click.Path(path_type=Path, file_okay=False))
@addr_option
@connect_timeout_option
@output_option("text")
def export_lerobot_command(
    statement: str, out_dir: Path, addr: str, connect_timeout: float | None, output: Output
) -> None:
    """Write the episodes STATEMENT selects (SELECT ... FROM ns.NAME_episodes ...) to OUT_DIR.

    OUT_DIR becomes a LeRobot v3.0 dataset: frames, tasks, stats and the
    episodes' videos (source MP4s copied whole when all their episodes are
    selected, else the selected episodes cut out by a stream copy).
    """
    with open_client(query_url(addr), connect_timeout) as client:
        done = export_lerobot(client, statement, out_dir)
    emit(
        done.as_json(),
        output,
        text=(
            f"exported {done.episode_count} episodes ({done.frame_count} frames, "
            f"{done.task_count} tasks, {done.videos_copied} videos copied, "
            f"{done.videos_cut} cut) to {done.root}"
        ),
    )
