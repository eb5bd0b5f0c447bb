"""HTML: every value escaped, the page frame, and the typed result grid.

Nothing reaches a page unescaped: :func:`e` is the one way text enters
HTML, and the helpers here build markup from escaped parts only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from html import escape
from typing import Any

import pyarrow as pa

from lake_core.filetype import is_file_field
from lake_core.output import type_name
from lake_sdk.sql_cli import json_value

__all__ = ["TRUNCATE_CHARS", "cell", "e", "grid", "page"]

#: Text longer than this shows truncated, with the whole value one click away.
TRUNCATE_CHARS = 120

_NAV = (("/tables", "Tables"), ("/query", "Query"), ("/plot", "Plot"), ("/cluster", "Cluster"))


def e(value: object) -> str:
    """``value`` as escaped HTML text (quotes too: safe inside attributes)."""
    return escape(str(value), quote=True)


def page(title: str, body: str, *, csrf: str | None = None, signed_in: bool = True) -> str:
    """A whole HTML page around ``body`` (already HTML)."""
    nav = "".join(f'<a href="{href}">{e(label)}</a>' for href, label in _NAV)
    signout = (
        '<form method="post" action="/signout" class="signout">'
        f'<input type="hidden" name="csrf" value="{e(csrf or "")}">'
        '<button type="submit" data-testid="sign-out">Sign out</button></form>'
        if signed_in
        else ""
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{e(title)} · Lake console</title>"
        '<meta name="referrer" content="no-referrer">'
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script></head><body>'
        f"<header><strong>Lake</strong><nav>{nav if signed_in else ''}</nav>{signout}</header>"
        f"<main><h1>{e(title)}</h1>{body}</main></body></html>"
    )


def error_box(error: BaseException) -> str:
    """A typed error: its Lake error class, then its message."""
    return (
        f'<div class="error" data-testid="error"><strong class="error-class">'
        f"{e(type(error).__name__)}</strong>: {e(error)}</div>"
    )


def _utc(value: datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text + " UTC"


def _text(value: Any) -> str:
    if isinstance(value, datetime):
        return _utc(value)
    if isinstance(value, dict | list):
        return json.dumps(json_value(value))
    return str(json_value(value))


def _numeric(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
    )


def cell(field: pa.Field, value: Any, file_link: str | None = None) -> str:
    """One ``<td>``: NULL as such, numbers right-aligned, timestamps in UTC, long text folded."""
    if file_link is not None and isinstance(value, dict):
        label = f"{value.get('media_type', '')} · {value.get('size_bytes', 0):,} B"
        return f'<td><a data-testid="file-link" href="{e(file_link)}">{e(label)}</a></td>'
    return _td(value, "num" if _numeric(field.type) else "")


def _td(value: Any, css: str) -> str:
    """A value's ``<td>`` (``css`` its column's class): what :func:`cell` shows without a link."""
    if value is None:
        return '<td class="null">NULL</td>'
    # str and int are their own text (``_text`` gives the same); others go the general way.
    kind = type(value)
    text = value if kind is str else str(value) if kind is int else _text(value)
    if len(text) > TRUNCATE_CHARS:
        inner = (
            f"<details><summary>{e(text[:TRUNCATE_CHARS])}…</summary>"
            f'<div class="full">{e(text)}</div></details>'
        )
    else:
        inner = e(text)
    return f'<td class="{css}">{inner}</td>'


def grid(
    table: pa.Table,
    *,
    first_row: int = 0,
    file_link: Callable[[int], str] | None = None,
) -> str:
    """The typed grid of ``table``'s rows; row ``i`` is result row ``first_row + i``.

    Rendered a column at a time (each column's type looked at once), then
    joined row by row: the same cells as :func:`cell` of each value.
    """
    schema = table.schema
    head = "".join(
        f'<th class="{"num" if _numeric(f.type) else ""}">{e(f.name)}'
        f'<span class="type">{e(type_name(f))}</span></th>'
        for f in schema
    )
    links: list[str] | None = None
    if file_link is not None and any(is_file_field(f) for f in schema):
        links = [file_link(first_row + i) for i in range(table.num_rows)]
    columns: list[list[str]] = []
    for field, column in zip(schema, table.columns, strict=True):
        values = column.to_pylist()
        if links is not None and is_file_field(field):
            columns.append([cell(field, v, link) for v, link in zip(values, links, strict=True)])
        else:
            css = "num" if _numeric(field.type) else ""
            columns.append([_td(v, css) for v in values])
    rows = "".join(
        f'<tr data-testid="result-row">{"".join(cells)}</tr>'
        for cells in (zip(*columns, strict=True) if columns else [()] * table.num_rows)
    )
    return (
        f'<table class="grid" data-testid="result-grid"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rows}</tbody></table>"
    )


def rows_list(items: Iterable[str]) -> str:
    return "".join(items)
