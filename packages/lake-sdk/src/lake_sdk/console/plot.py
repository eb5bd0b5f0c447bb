"""Line, scatter and histogram charts of result columns, drawn as SVG on the server.

No chart library: the SVG is a few dozen elements built from escaped
numbers. At most ``MAX_POINTS`` rows of the result are plotted (said on
the page when there were more).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pyarrow as pa

from lake_core.errors import InvalidArgument
from lake_sdk.console.render import e

__all__ = ["KINDS", "MAX_POINTS", "svg_chart"]

KINDS = ("line", "scatter", "histogram")
MAX_POINTS = 10_000
_W, _H, _PAD = 720, 360, 48
_BINS = 20


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    return None


def _column(table: pa.Table, name: str) -> list[float | None]:
    if name not in table.column_names:
        raise InvalidArgument(f"the result has no column {name!r}")
    values = [_number(v) for v in table.column(name).to_pylist()]
    if not any(v is not None for v in values):
        raise InvalidArgument(f"column {name!r} has no numbers or timestamps to plot")
    return values


def _scale(lo: float, hi: float, size: float, flip: bool) -> Any:
    span = (hi - lo) or 1.0

    def at(v: float) -> float:
        t = (v - lo) / span
        return _PAD + (1 - t) * size if flip else _PAD + t * size

    return at


def _axes(x_lo: float, x_hi: float, y_lo: float, y_hi: float, x: str, y: str) -> str:
    w, h = _W - 2 * _PAD, _H - 2 * _PAD
    return (
        f'<line x1="{_PAD}" y1="{_PAD + h}" x2="{_PAD + w}" y2="{_PAD + h}" class="axis"/>'
        f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_PAD + h}" class="axis"/>'
        f'<text x="{_PAD}" y="{_H - 8}">{e(f"{x_lo:.4g}")}</text>'
        f'<text x="{_PAD + w}" y="{_H - 8}" text-anchor="end">{e(f"{x_hi:.4g}")}</text>'
        f'<text x="{_PAD + w / 2}" y="{_H - 8}" text-anchor="middle">{e(x)}</text>'
        f'<text x="4" y="{_PAD + h}">{e(f"{y_lo:.4g}")}</text>'
        f'<text x="4" y="{_PAD - 8}">{e(f"{y_hi:.4g}")} {e(y)}</text>'
    )


def svg_chart(table: pa.Table, kind: str, x: str, y: str) -> str:
    """The chart as one ``<svg data-testid="chart">`` element."""
    if kind not in KINDS:
        raise InvalidArgument(f"kind must be one of {', '.join(KINDS)}")
    w, h = _W - 2 * _PAD, _H - 2 * _PAD
    body: list[str] = []
    if kind == "histogram":
        values = [v for v in _column(table, x) if v is not None]
        lo, hi = min(values), max(values)
        width = (hi - lo) / _BINS or 1.0
        counts = [0] * _BINS
        for v in values:
            counts[min(_BINS - 1, int((v - lo) / width))] += 1
        top = max(counts)
        sx, sy = _scale(lo, lo + width * _BINS, w, False), _scale(0, top, h, True)
        for i, n in enumerate(counts):
            x0, x1 = sx(lo + i * width), sx(lo + (i + 1) * width)
            body.append(
                f'<rect class="bar" x="{x0:.1f}" y="{sy(n):.1f}" width="{max(0.5, x1 - x0 - 1):.1f}" '
                f'height="{sy(0) - sy(n):.1f}"><title>{n}</title></rect>'
            )
        body.append(_axes(lo, lo + width * _BINS, 0, top, x, "count"))
    else:
        pairs = [
            (a, b)
            for a, b in zip(_column(table, x), _column(table, y), strict=True)
            if a is not None and b is not None
        ]
        if kind == "line":
            pairs.sort()
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        sx = _scale(min(xs), max(xs), w, False)
        sy = _scale(min(ys), max(ys), h, True)
        points = [(sx(a), sy(b)) for a, b in pairs]
        if kind == "line":
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            body.append(f'<polyline class="series" fill="none" points="{path}"/>')
        else:
            body.extend(
                f'<circle class="dot" cx="{px:.1f}" cy="{py:.1f}" r="3"/>' for px, py in points
            )
        body.append(_axes(min(xs), max(xs), min(ys), max(ys), x, y))
    return (
        f'<svg data-testid="chart" data-kind="{e(kind)}" viewBox="0 0 {_W} {_H}" '
        f'width="{_W}" height="{_H}" role="img" xmlns="http://www.w3.org/2000/svg">'
        f"{''.join(body)}</svg>"
    )


def plot_form(state: Any, kind: str, x: str, y: str) -> str:
    """The chart's controls: the statement, the kind and the columns (all in the URL)."""
    options = "".join(
        f'<option value="{k}"{" selected" if k == kind else ""}>{k}</option>' for k in KINDS
    )
    return (
        '<form method="get" action="/plot" class="sql">'
        f'<textarea name="sql" data-testid="sql-input" rows="3">{e(state.sql)}</textarea>'
        f'<input type="hidden" name="as_of" value="{e(state.as_of)}">'
        f'<label>chart <select name="kind" data-testid="plot-kind">{options}</select></label> '
        f'<label>x <input name="x" data-testid="plot-x" value="{e(x)}"></label> '
        f'<label>y <input name="y" data-testid="plot-y" value="{e(y)}"></label> '
        '<button type="submit" data-testid="plot-run">Plot</button></form>'
    )


def plot_result(table: pa.Table, more: bool, kind: str, x: str, y: str) -> str:
    """The chart of ``table``, or the columns to choose from when none is chosen yet."""
    if not x or (kind != "histogram" and not y):
        names = ", ".join(table.column_names)
        return f"<p>Choose the columns to plot: {e(names)}</p>"
    note = f"<p>The first {MAX_POINTS:,} rows are plotted.</p>" if more else ""
    return note + svg_chart(table, kind, x, y)
