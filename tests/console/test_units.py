"""The console's pure parts: the loopback rule, Range parsing, FILE links, cell rendering."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from lake_core.errors import InvalidArgument
from lake_core.filetype import file_field, is_file_field
from lake_core.models import DataLocation
from lake_objects import FileUpload, StageSettings, open_store
from lake_objects.file_chunks import FileChunks
from lake_objects.reader import ObjectReader
from lake_objects.store import ManagedObjectStore
from lake_sdk.console.cli import console
from lake_sdk.console.file_pages import (
    MappedRangeResponse,
    RangeResponse,
    decode_location,
    encode_location,
    parse_range,
)
from lake_sdk.console.render import TRUNCATE_CHARS, _numeric, _text, cell, e, grid

LOCATION = {
    "uri": "file:///data/objects/tenants/acme/ab/cd",
    "media_type": "video/mp4",
    "size_bytes": 10,
    "sha256": "0" * 64,
}


def test_plaintext_console_listens_on_loopback_only() -> None:
    refused = CliRunner().invoke(console, ["--addr", "0.0.0.0:8080"])
    assert refused.exit_code == 2
    assert "not a loopback address" in refused.output
    half = CliRunner().invoke(console, ["--addr", "127.0.0.1:8080", "--tls-cert", __file__])
    assert half.exit_code == 2
    assert "both --tls-cert and --tls-key" in half.output


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-99", (0, 100)),
        ("bytes=10-", (10, 60)),  # open-ended: one chunk (limit 50)
        ("bytes=-30", (970, 1000)),
        ("bytes=990-5000", (990, 1000)),
        ("bytes=0-9, 20-29", (0, 10)),  # the first range only
    ],
)
def test_ranges_are_clipped_to_the_object_and_the_chunk(
    header: str, expected: tuple[int, int]
) -> None:
    wanted = parse_range(header, 1000, 50 if header == "bytes=10-" else 10_000)
    assert wanted is not None
    assert (wanted.start, wanted.end) == expected


@pytest.mark.parametrize("header", ["bytes=1000-", "bytes=5-2", "bytes=-", "items=0-1", "bytes=x-"])
def test_unsatisfiable_ranges(header: str) -> None:
    assert parse_range(header, 1000, 100) is None


def test_file_links_round_trip_and_refuse_garbage() -> None:
    assert decode_location(encode_location(LOCATION)).model_dump() == LOCATION
    for bad in ("", "not-base64!", encode_location({**LOCATION, "sha256": "zz"})):
        with pytest.raises(InvalidArgument):
            decode_location(bad)


def test_cells_are_escaped_typed_and_folded() -> None:
    text = pa.field("t", pa.utf8())
    assert cell(text, "<b>&") == '<td class="">&lt;b&gt;&amp;</td>'
    assert cell(pa.field("n", pa.int64()), None) == '<td class="null">NULL</td>'
    assert 'class="num"' in cell(pa.field("n", pa.int64()), 3)
    folded = cell(text, "q" * 500)
    assert "<details>" in folded
    assert folded.count("q") == 120 + 500
    table = pa.table({"v": pa.array([LOCATION], file_field("v").type)}).cast(
        pa.schema([file_field("v")])
    )
    html = grid(table, file_link=lambda row: f'/episode?row={row}&x="<')
    assert 'data-testid="file-link" href="/episode?row=0&amp;x=&quot;&lt;"' in html


def _cell_as_first_written(field: pa.Field, value: Any, file_link: str | None) -> str:
    """:func:`cell` before its fast paths: every value through ``_text``, types asked per cell."""
    if value is None:
        return '<td class="null">NULL</td>'
    if file_link is not None and isinstance(value, dict):
        label = f"{value.get('media_type', '')} · {value.get('size_bytes', 0):,} B"
        return f'<td><a data-testid="file-link" href="{e(file_link)}">{e(label)}</a></td>'
    text = _text(value)
    css = "num" if _numeric(field.type) else ""
    if len(text) > TRUNCATE_CHARS:
        inner = (
            f"<details><summary>{e(text[:TRUNCATE_CHARS])}…</summary>"
            f'<div class="full">{e(text)}</div></details>'
        )
    else:
        inner = e(text)
    return f'<td class="{css}">{inner}</td>'


def _grid_row_by_row(table: pa.Table, first_row: int, file_link: Callable[[int], str]) -> str:
    """The grid as it was first written: each row's dict, each value's cell in turn."""
    files = [is_file_field(f) for f in table.schema]
    rows = []
    for i, row in enumerate(table.to_pylist()):
        link = file_link(first_row + i)
        cells = "".join(
            _cell_as_first_written(f, row[f.name], link if is_file else None)
            for f, is_file in zip(table.schema, files, strict=True)
        )
        rows.append(f'<tr data-testid="result-row">{cells}</tr>')
    return "".join(rows)


def _generated_table(rng: random.Random, rows: int) -> pa.Table:
    """Every kind of column the grid shows, with nulls, NaN, infinities, edge and long values."""

    def maybe(value: object) -> object:
        return None if rng.random() < 0.2 else value

    ints = [0, 1, -1, 2**63 - 1, -(2**63), 42]
    floats = [0.0, -0.0, 1.5, math.nan, math.inf, -math.inf, 1e300, 5e-324]
    texts = ["", "<script>alert(1)</script>", "a&b\"c'd", "é ✓ 🤖", "x" * 119, "y" * 120]
    texts += ["<" * 121, "z" * 500]
    base = datetime(2026, 1, 1, tzinfo=UTC)
    location = {**LOCATION, "media_type": "video/<mp4>"}
    columns = {
        "i8": pa.array([maybe(rng.choice([-128, 0, 127])) for _ in range(rows)], pa.int8()),
        "i64": pa.array([maybe(rng.choice(ints)) for _ in range(rows)], pa.int64()),
        "u64": pa.array([maybe(rng.choice([0, 2**64 - 1])) for _ in range(rows)], pa.uint64()),
        "f64": pa.array([maybe(rng.choice(floats)) for _ in range(rows)], pa.float64()),
        "f32": pa.array([maybe(rng.choice([1.25, math.nan])) for _ in range(rows)], pa.float32()),
        "dec": pa.array(
            [maybe(Decimal(rng.choice(["1.50", "-0.01", "99999.99"]))) for _ in range(rows)],
            pa.decimal128(7, 2),
        ),
        "flag": pa.array([maybe(rng.random() < 0.5) for _ in range(rows)], pa.bool_()),
        "text": pa.array([maybe(rng.choice(texts)) for _ in range(rows)], pa.utf8()),
        "big": pa.array([maybe(rng.choice(texts)) for _ in range(rows)], pa.large_utf8()),
        "raw": pa.array([maybe(rng.randbytes(rng.randrange(0, 100))) for _ in range(rows)]),
        "ts_utc": pa.array(
            [maybe(base + timedelta(microseconds=rng.randrange(10**12))) for _ in range(rows)],
            pa.timestamp("us", tz="UTC"),
        ),
        "ts_paris": pa.array(
            [maybe(base + timedelta(seconds=rng.randrange(10**6))) for _ in range(rows)],
            pa.timestamp("s", tz="Europe/Paris"),
        ),
        "ts_naive": pa.array(
            [
                maybe(datetime(2026, 5, 1) + timedelta(milliseconds=rng.randrange(10**9)))
                for _ in range(rows)
            ],
            pa.timestamp("ms"),
        ),
        "day": pa.array([maybe(date(2026, 2, rng.randrange(1, 28))) for _ in range(rows)]),
        "span": pa.array([maybe(timedelta(seconds=rng.randrange(-99, 99))) for _ in range(rows)]),
        "ints": pa.array(
            [maybe([rng.choice(ints) for _ in range(rng.randrange(0, 40))]) for _ in range(rows)],
            pa.list_(pa.int64()),
        ),
        "pose": pa.array(
            [maybe({"x": rng.choice(floats), "label": rng.choice(texts)}) for _ in range(rows)],
            pa.struct([("x", pa.float64()), ("label", pa.utf8())]),
        ),
        "video": pa.array([maybe(location) for _ in range(rows)], file_field("video").type),
    }
    table = pa.table(columns)
    schema = pa.schema([file_field("video") if f.name == "video" else f for f in table.schema])
    return table.cast(schema)


@pytest.mark.parametrize("seed", range(8))
def test_grid_by_columns_agrees_with_cells_row_by_row(seed: int) -> None:
    rng = random.Random(seed)
    table = _generated_table(rng, rng.randrange(0, 60))
    first_row = rng.randrange(0, 1000)

    def link(row: int) -> str:
        return f"/episode?sql=SELECT+%3C1%3E&row={row}"

    html = grid(table, first_row=first_row, file_link=link)
    body = html[html.index("<tbody>") + len("<tbody>") : html.rindex("</tbody>")]
    assert body == _grid_row_by_row(table, first_row, link)
    for field, column in zip(table.schema, table.columns, strict=True):
        for value in column.to_pylist():
            assert cell(field, value) == _cell_as_first_written(field, value, None)
    assert body.count('data-testid="result-row"') == table.num_rows
    assert "<script>" not in body


async def _stored(tmp_path: Path, data: bytes) -> tuple[ManagedObjectStore, DataLocation]:
    store = open_store(StageSettings.local(tmp_path / "objects").descriptor("acme"))
    source = tmp_path / "video.mp4"
    source.write_bytes(data)
    return store, await store.upload(FileUpload.from_path(source, "video/mp4"))


def _range_reader(
    path: Path, location: DataLocation, start: int, end: int
) -> tuple[ObjectReader, list[bool]]:
    """A local reader of ``start..end`` (4 MiB chunks) that records its closing."""
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    file = path.open("rb")
    file.seek(start)
    chunks = FileChunks(file, end - start, 4 * 1024 * 1024)
    return ObjectReader(location, chunks, start=start, end=end, close=close), closed


@pytest.mark.asyncio
async def test_a_range_response_from_a_reader_sends_its_bytes_and_closes_it(
    tmp_path: Path,
) -> None:
    """Stages without local files (S3) serve ranges from a reader: exact bytes, then closed."""
    data = random.Random(3).randbytes(9 * 1024 * 1024 + 5)
    _, location = await _stored(tmp_path, data)
    path = Path(location.uri.removeprefix("file://"))
    start, end = 3, 9 * 1024 * 1024  # three chunks
    reader, closed = _range_reader(path, location, start, end)
    headers = {"Content-Length": str(end - start)}
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await RangeResponse(reader, headers, "video/mp4")({"type": "http"}, _no_receive, send)
    assert sent[0]["status"] == 206
    assert (b"content-length", str(end - start).encode()) in sent[0]["headers"]
    assert [m["more_body"] for m in sent[1:]] == [True, True, False]
    assert b"".join(m["body"] for m in sent[1:]) == data[start:end]
    assert closed == [True]

    # A client gone before the header: the read already started ends, then the reader closes.
    reader, closed = _range_reader(path, location, start, end)

    async def gone(message: Any) -> None:
        raise OSError("the client went away")

    with pytest.raises(OSError, match="went away"):
        await RangeResponse(reader, headers, "video/mp4")({"type": "http"}, _no_receive, gone)
    assert closed == [True]


@pytest.mark.asyncio
async def test_a_mapped_range_response_sends_the_view_once(tmp_path: Path) -> None:
    data = random.Random(4).randbytes(100_000)
    store, location = await _stored(tmp_path, data)
    view = await store.map_range(location, 5000, 70_001)
    assert view is not None
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    response = MappedRangeResponse(view, {"Content-Length": str(65_001)}, "video/mp4")
    del view
    await response({"type": "http"}, _no_receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert bytes(sent[1]["body"]) == data[5000:70_001]
    assert response.view is None  # the mapping lives only as long as the server's reference


async def _no_receive() -> Any:
    raise AssertionError("a range response never reads the request")
