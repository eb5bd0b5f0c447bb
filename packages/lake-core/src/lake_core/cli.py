"""The ``lake`` command root.

Each installed Lake package adds its subcommands through the ``lake.commands``
entry-point group, so installing lake-sdk gives the client commands and
installing ``lake-query`` adds ``lake query``. Two packages may add commands
to one group by registering groups of the same name: ``lake table`` holds
lake-metasrv's local commands and lake-sdk's ``load`` (through Query), with
whichever packages are installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import entry_points, version
from typing import Any, TypeVar

import click

from lake_core.credentials import credential_error
from lake_core.errors import LakeError

ENTRY_POINT_GROUP = "lake.commands"
#: ``ctx.meta`` key of the root's ``--data-dir`` (subcommands read it from there).
DATA_DIR_META = "lake.data_dir"

#: Exit statuses of every ``lake`` command (docs/cli.md, "Exit status"): a check that
#: found problems (``verify``); a refused command (click's usage errors, and Lake
#: errors that rerunning will not fix); a retryable fault (storage or a server
#: unavailable, a timeout: rerun later); Ctrl-C.
EXIT_FINDINGS = 1
EXIT_REFUSED = 2
EXIT_RETRYABLE = 75  # sysexits EX_TEMPFAIL
EXIT_INTERRUPTED = 130

F = TypeVar("F", bound=Callable[..., Any])


def exit_status(error: LakeError) -> int:
    """The exit status for a Lake error: a storage fault is never shown as the caller's mistake."""
    return EXIT_RETRYABLE if error.retryable else EXIT_REFUSED


class CommandRefused(click.ClickException):
    """A Lake error rerunning will not fix, printed on one line (click would exit 1)."""

    exit_code = EXIT_REFUSED


class CommandRetryable(click.ClickException):
    """A retryable Lake error (an outage), printed on one line."""

    exit_code = EXIT_RETRYABLE


def command_error(error: LakeError) -> click.ClickException:
    """``error`` for a command to raise, with its :func:`exit_status`."""
    return (CommandRetryable if error.retryable else CommandRefused)(str(error))


def data_dir_option(default: str | None, help: str, **options: Any) -> Callable[[F], F]:
    """A subcommand's ``--data-dir``: its own value, else the root's, else ``default``.

    ``lake --data-dir D table list`` and ``lake table list --data-dir D`` must
    read the same directory; a subcommand that kept its own default silently
    read ``./lake-data`` instead of D. ``options`` go to ``click.option`` (type, metavar).
    """

    def resolve(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            return value
        root: str | None = ctx.meta.get(DATA_DIR_META)
        return root if root is not None else default

    shown = f"  [default: {default}]" if default is not None else ""
    return click.option(
        "--data-dir",
        default=None,
        callback=resolve,
        help=f"{help} (also `lake --data-dir`).{shown}",
        **options,
    )


class _LakeGroup(click.Group):
    """Loads subcommands lazily from entry points."""

    def _entry_points(self) -> dict[str, list[object]]:
        found: dict[str, list[object]] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            found.setdefault(ep.name, []).append(ep)
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        loaded = [ep.load() for ep in self._entry_points().get(cmd_name, [])]  # type: ignore[attr-defined]
        commands = [c for c in loaded if isinstance(c, click.Command)]
        if len(commands) > 1 and all(isinstance(c, click.Group) for c in commands):
            return _merged(cmd_name, commands)
        return commands[0] if commands else None

    def invoke(self, ctx: click.Context) -> Any:
        """Refuse ``lake --data-dir`` for a subcommand that reads no data directory.

        Ignoring it would run the command against something else than the
        user named (``lake --data-dir D sql`` still asks the Query at --addr).
        """
        if ctx.params.get("data_dir") is not None:
            names, command = self._leaf(ctx, [*ctx._protected_args, *ctx.args])
            if command is not None and not any(p.name == "data_dir" for p in command.params):
                raise click.UsageError(
                    f"`lake --data-dir` does not apply to `lake {' '.join(names)}`: "
                    "it reads no local data directory"
                )
        return super().invoke(ctx)

    def _leaf(self, ctx: click.Context, args: list[str]) -> tuple[list[str], click.Command | None]:
        """The command ``args`` name (through nested groups), or None if that is not plain."""
        command: click.Command = self
        names: list[str] = []
        while isinstance(command, click.Group):
            if not args or args[0].startswith("-"):
                return names, None  # a group's own help or options: nothing runs
            found = command.get_command(ctx, args[0])
            if found is None:
                return names, None  # click reports the unknown name itself
            names.append(args[0])
            command, args = found, args[1:]
        return names, command


def _merged(name: str, groups: list[click.Command]) -> click.Group:
    """One group holding every command of ``groups`` (same-named groups of several packages).

    The groups take no options of their own; their help texts are joined.
    """
    # By defining module, so help and listings read the same in every environment.
    groups = sorted(groups, key=lambda g: getattr(g.callback, "__module__", "") or "")
    helps = [g.help for g in groups if g.help]
    merged = click.Group(name, help="\n\n".join(dict.fromkeys(helps)) or None)
    for group in groups:
        assert isinstance(group, click.Group)
        for command_name, command in group.commands.items():
            merged.add_command(command, command_name)
    return merged


@click.group(cls=_LakeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version("lake-core"), prog_name="lake")
@click.option(
    "--data-dir",
    default=None,
    metavar="DIR",
    help=(
        "Local Lake data directory, for the subcommands that read one (`lake --data-dir D "
        "table list`: gc, meta, query, table, demo); the others refuse it."
    ),
)
@click.pass_context
def lake(ctx: click.Context, data_dir: str | None) -> None:
    """Lake: versioned tables and immutable files for robot fleets."""
    if data_dir is not None:
        ctx.meta[DATA_DIR_META] = data_dir


def main() -> None:
    try:
        lake.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except LakeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exit_status(exc))
    except Exception as exc:
        # A missing cloud credential is the user's setup, not a bug: one line, no traceback.
        missing = credential_error(exc)
        if missing is None:
            raise
        click.echo(f"error: {missing}", err=True)
        sys.exit(EXIT_REFUSED)
