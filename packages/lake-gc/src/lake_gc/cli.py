"""``lake [--data-dir DIR] gc``: plan (the default, never deletes) or apply a plan.

    lake --data-dir ./data gc --plan ./gc-plans/2026-07-11 --safety-age-secs 86400 --json
    lake --data-dir ./data gc --plan ./gc-plans/2026-07-11 --apply \\
        --checkpoint ./gc-plans/2026-07-11.apply.json --json

A progress bar (rich, on stderr) is shown on a terminal, never with ``--json``
(``--output json``) or ``LAKE_NO_PROGRESS`` set.
Errors exit 2; with ``--json`` they print ``{"error": <class>, ...}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from lake_core.cli import DATA_DIR_META, exit_status
from lake_core.config import APPEND_OPERATION_RETENTION_SECS, operation_retention_secs
from lake_core.errors import LakeError
from lake_core.output import Output, output_option
from lake_objects.progress import progress_enabled

__all__ = ["gc"]

DEFAULT_DATA_DIR = "./lake-data"


@contextmanager
def _bar(enabled: bool, what: str, total: int | None = None) -> Iterator[Any]:
    """A rich progress bar on stderr, or a no-op updater."""
    if not enabled:
        yield lambda *_: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, transient=True, console=_console()) as progress:
        task = progress.add_task(what, total=total)

        def update(phase: str | int, done: int, total: int | None = None) -> None:
            description = phase if isinstance(phase, str) else what
            progress.update(task, description=description, completed=done, total=total)

        yield update


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _fail(error: LakeError, as_json: bool) -> None:
    if as_json:
        click.echo(
            json.dumps({"error": error.code, "message": str(error), "retryable": error.retryable})
        )
    else:
        click.echo(f"error: {error}", err=True)
    sys.exit(exit_status(error))


@click.command("gc")
@click.option(
    "--data-dir",
    "data_dir",
    default=None,
    help=f"Local Lake data directory (also `lake --data-dir`; default {DEFAULT_DATA_DIR}).",
)
@click.option(
    "--plan",
    "plan_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The plan directory: new when planning, an existing plan with --apply.",
)
@click.option(
    "--safety-age-secs",
    type=click.IntRange(min=0),
    default=None,
    help="Only objects older than this are candidates (longer than any upload-to-INSERT).",
)
@click.option("--apply", "apply", is_flag=True, help="Delete exactly the plan's candidates.")
@click.option(
    "--checkpoint",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Apply's progress file (fsync'd after each page; resumed from when present).",
)
@click.option(
    "--page-size",
    type=click.IntRange(1, 1000),
    default=1000,
    show_default=True,
    help="Candidates per plan page (one checkpoint step of apply).",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --output json.")
@output_option("text")
@click.pass_context
def gc(
    ctx: click.Context,
    data_dir: str | None,
    plan_dir: Path,
    safety_age_secs: int | None,
    apply: bool,
    checkpoint: Path | None,
    page_size: int,
    as_json: bool,
    output: Output,
) -> None:
    """Garbage-collect managed objects no table version references: plan, then apply."""
    from lake_gc.apply import apply_plan
    from lake_gc.plan import load_plan, make_plan
    from lake_gc.target import GcTarget

    root = data_dir or ctx.meta.get(DATA_DIR_META) or DEFAULT_DATA_DIR
    as_json = as_json or output == "json"
    # A bar on an interactive terminal only, and never with LAKE_NO_PROGRESS set.
    show = not as_json and progress_enabled(stream=sys.stderr)
    if apply and checkpoint is None:
        raise click.UsageError("--apply needs --checkpoint FILE")
    if not apply and safety_age_secs is None:
        raise click.UsageError("planning needs --safety-age-secs N")
    if not apply and checkpoint is not None:
        raise click.UsageError("--checkpoint is for --apply")
    try:
        target = GcTarget.from_env(Path(root))
        if apply:
            assert checkpoint is not None
            plan = load_plan(plan_dir)
            with _bar(show, "deleting", len(plan.manifest.pages)) as update:
                result = apply_plan(
                    plan,
                    checkpoint,
                    roots=target.roots,
                    sidecars=target.sidecars,
                    stage=target.stage,
                    progress=lambda done, total: update(done, done, total),
                )
            summary = result.summary()
            text = (
                f"plan {result.plan_id[:12]}: {summary['deleted']} deleted, "
                f"{summary['already_absent']} already absent, "
                f"{summary['pages_done']}/{summary['pages']} pages"
            )
        else:
            assert safety_age_secs is not None
            warnings = _resume_warnings(safety_age_secs)  # a bad setting fails before planning
            with _bar(show, "inventory") as update:
                made = make_plan(
                    plan_dir,
                    roots=target.roots,
                    sidecars=target.sidecars,
                    stage=target.stage,
                    safety_age_secs=safety_age_secs,
                    page_size=page_size,
                    progress=lambda phase, done: update(phase, done),
                )
            summary = made.summary()
            summary["warnings"] = warnings
            text = (
                f"plan {made.plan_id[:12]} in {plan_dir}: {summary['candidates']} candidates, "
                f"{summary['candidate_bytes']} bytes (of {summary['inventory']} inventoried; "
                f"{summary['referenced']} referenced, {summary['younger_than_safety_age']} "
                "younger than the safety age). Nothing was deleted; review, then --apply."
            )
    except LakeError as error:
        _fail(error, as_json)
        return
    for warning in summary.get("warnings", ()):
        click.echo(f"warning: {warning}", err=True)
    click.echo(json.dumps(summary, indent=2) if as_json else text)


def _resume_warnings(safety_age_secs: int) -> list[str]:
    """Why this safety age may let GC delete what a resumed pending append references.

    The SDK may resume a pending append (docs/files.md, "Durable appends") until
    Metasrv forgets its operation id; its FILE values name objects uploaded
    before. The contract (docs/gc.md) says an object older than the safety age
    never becomes newly referenced, which only holds if clients resume sooner.
    """
    retention = operation_retention_secs()
    if safety_age_secs >= retention:
        return []
    return [
        f"the safety age ({safety_age_secs} s) is shorter than "
        f"{APPEND_OPERATION_RETENTION_SECS} ({retention} s): a pending append an SDK "
        "resumes later than the safety age after its upload references objects this plan "
        "may delete. Resume pending appends sooner (docs/gc.md, 'Pending appends'), or "
        "plan with a safety age of at least the retention."
    ]
