"""How every ``lake`` command prints its result: ``--output text|json``, one type rendering.

A command builds one plain value (dicts, lists, strings, numbers) and hands
it to :func:`emit`; ``json`` prints it as one JSON document on stdout (for
scripts and ``jq``), ``text`` as lines for people. Column types render the
same way everywhere through :func:`type_name`: a FILE column is ``file``,
every other type is Arrow's name for it (``string``, ``double``,
``timestamp[us, tz=UTC]``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime
from typing import Any, Literal, TypeVar

import click
import pyarrow as pa

from lake_core.filetype import is_file_field

__all__ = [
    "OUTPUTS",
    "Output",
    "column_text",
    "emit",
    "output_option",
    "render_json",
    "render_text",
    "schema_columns",
    "type_name",
]

Output = Literal["text", "json"]
OUTPUTS: tuple[Output, ...] = ("text", "json")

F = TypeVar("F", bound=Callable[..., Any])


def output_option(default: Output) -> Callable[[F], F]:
    """``--output``/``-o`` for one command; ``default`` is what it printed before 0.2."""
    return click.option(
        "--output",
        "-o",
        "output",
        type=click.Choice(OUTPUTS),
        default=default,
        show_default=True,
        help="text for people, json for scripts (one JSON document on stdout).",
    )


def type_name(field: pa.Field) -> str:
    """A column's type as every command shows it (FILE is ``file``)."""
    return "file" if is_file_field(field) else str(field.type)


def column_text(field: pa.Field) -> str:
    return f"{field.name}: {type_name(field)}"


def schema_columns(schema: pa.Schema) -> list[str]:
    """``["name: type", ...]``: the ``columns`` entry of describe-style output."""
    return [column_text(f) for f in schema]


def _plain(value: object) -> object:
    # JSON's fallback for values a command may pass through (timestamps, bytes).
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def render_json(value: object) -> str:
    return json.dumps(value, indent=2, default=_plain)


def _scalar(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_scalar(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={_scalar(v)}" for k, v in value.items())
    return "" if value is None else str(_plain(value) if not isinstance(value, str) else value)


def _rows(items: Sequence[Mapping[str, Any]]) -> str:
    keys = list(dict.fromkeys(k for item in items for k in item))
    cells = [[_scalar(item.get(k)) for k in keys] for item in items]
    widths = [max([len(k), *(len(row[i]) for row in cells)]) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render_text(value: object) -> str:
    """Lines for people: ``key: value`` for a mapping, aligned columns for a list of them."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        lines = []
        for key, item in value.items():
            if isinstance(item, list) and item and all(isinstance(i, Mapping) for i in item):
                lines.append(f"{key}:")
                lines.extend(f"  {line}" for line in _rows(item).splitlines())
            elif isinstance(item, list) and item and all(isinstance(i, str) for i in item):
                lines.append(f"{key}:")
                lines.extend(f"  {i}" for i in item)
            else:
                lines.append(f"{key}: {_scalar(item)}")
        return "\n".join(lines)
    if isinstance(value, list | tuple):
        if not value:
            return "(none)"
        if all(isinstance(i, Mapping) for i in value):
            return _rows(value)
        return "\n".join(_scalar(i) for i in value)
    return _scalar(value)


def emit(value: object, output: Output, *, text: str | None = None) -> None:
    """Print ``value`` as ``output``; ``text`` overrides the generic text rendering."""
    if output == "json":
        click.echo(render_json(value))
    else:
        click.echo(text if text is not None else render_text(value))
