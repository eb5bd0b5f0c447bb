"""The console's pure parts: the loopback rule, Range parsing, FILE links, cell rendering."""

from __future__ import annotations

import pyarrow as pa
import pytest
from click.testing import CliRunner

from lake_core.errors import InvalidArgument
from lake_core.filetype import file_field
from lake_sdk.console.cli import console
from lake_sdk.console.file_pages import decode_location, encode_location, parse_range
from lake_sdk.console.render import cell, grid

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
