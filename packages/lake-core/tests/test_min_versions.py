"""The lake-min-versions header: what a client committed, bounded and validated."""

from __future__ import annotations

import pytest

from lake_core.errors import InvalidArgument
from lake_core.min_versions import (
    MAX_HEADER_BYTES,
    MAX_TABLES,
    format_min_versions,
    parse_min_versions,
)
from lake_core.names import TableRef


def test_round_trip_keeps_the_highest_version_per_table() -> None:
    versions = {TableRef("ns", "t"): 42, TableRef("ns", "u"): 7}
    text = format_min_versions(versions)
    assert text == "ns.t=42,ns.u=7"
    assert parse_min_versions(text) == versions
    assert parse_min_versions("ns.t=3, lake.ns.t=9") == {TableRef("ns", "t"): 9}
    assert parse_min_versions(None) == {} == parse_min_versions("")


@pytest.mark.parametrize(
    "value",
    [
        "ns.t",
        "ns.t=",
        "ns.t=-1",
        "t=1",
        "NS.t=1",
        "ns.t=1,",
        "ns.t=1;ns.u=2",
        "ns.t=99999999999999999999",
        "ns.t=9223372036854775808",
        "a.b.c.d=1",
    ],
)
def test_malformed_values_are_invalid_argument(value: str) -> None:
    with pytest.raises(InvalidArgument, match="lake-min-versions"):
        parse_min_versions(value)


def test_bounds() -> None:
    many = {TableRef("ns", f"t{i}"): i for i in range(MAX_TABLES + 5)}
    sent = format_min_versions(many)
    assert len(parse_min_versions(sent)) == MAX_TABLES  # the first (most recent) ones
    with pytest.raises(InvalidArgument, match="more than"):
        parse_min_versions(",".join(f"ns.t{i}={i}" for i in range(MAX_TABLES + 1)))
    with pytest.raises(InvalidArgument, match="bytes"):
        parse_min_versions("ns.t=1," * (MAX_HEADER_BYTES // 4))
    long_names = {TableRef("n" * 63, f"{'t' * 60}{i:03d}"): 10**18 for i in range(MAX_TABLES)}
    text = format_min_versions(long_names)
    assert len(text) <= MAX_HEADER_BYTES
    assert parse_min_versions(text)
