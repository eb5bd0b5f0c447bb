"""as_of as SQL: the selector text and the rewrite of lake.<ns>.<table> names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from lake_sdk import InvalidArgument, as_of_sql
from lake_sdk._time_travel import selector, versions_sql


def test_selectors() -> None:
    assert selector(3) == "@v3"
    assert selector("3") == selector("v3") == "@v3"
    assert selector(datetime(2026, 11, 30, 12, tzinfo=UTC)) == "@2026-11-30T12:00:00Z"
    east = timezone(timedelta(hours=2))
    assert selector(datetime(2026, 11, 30, 14, 0, 0, 5, tzinfo=east)) == (
        "@2026-11-30T12:00:00.000005Z"
    )
    assert selector("2026-11-30T12:00:00Z") == "@2026-11-30T12:00:00Z"
    for bad in (-1, True, datetime(2026, 11, 30), "yesterday", "2026-11-30T12:00:00", 1.5):
        with pytest.raises(InvalidArgument):
            selector(bad)  # type: ignore[arg-type]


def test_every_qualified_lake_name_is_rewritten() -> None:
    sql = (
        "WITH x AS (SELECT * FROM lake.robots.episodes) "
        'SELECT e.id, lake.robots.episodes.robot FROM LAKE.Robots."episodes" e '
        "JOIN lake . robots . rewards r ON e.id = r.id, lake.robots.episodes"
    )
    assert as_of_sql(sql, 2) == (
        'WITH x AS (SELECT * FROM lake.robots."episodes@v2") '
        'SELECT e.id, lake.robots."episodes@v2".robot FROM LAKE.Robots."episodes@v2" e '
        'JOIN lake . robots . "rewards@v2" r ON e.id = r.id, lake.robots."episodes@v2"'
    )


def test_literals_comments_and_explicit_selectors_are_left_alone() -> None:
    sql = (
        "SELECT 'lake.robots.episodes' AS s -- lake.robots.episodes\n"
        '/* lake.a.b */ FROM lake.robots."episodes@v1" JOIN lake.robots.rewards USING (id)'
    )
    assert as_of_sql(sql, 5) == (
        "SELECT 'lake.robots.episodes' AS s -- lake.robots.episodes\n"
        '/* lake.a.b */ FROM lake.robots."episodes@v1" JOIN lake.robots."rewards@v5" USING (id)'
    )
    assert as_of_sql("SELECT * FROM x.lake.a.b, lake.a.b", 1) == (
        'SELECT * FROM x.lake.a.b, lake.a."b@v1"'
    )


def test_sql_without_a_qualified_lake_name_is_refused() -> None:
    for sql in ("SELECT * FROM robots.episodes", "SELECT 1", "SELECT * FROM iceberg.a.b"):
        with pytest.raises(InvalidArgument, match="fully qualified"):
            as_of_sql(sql, 1)


def test_versions_sql() -> None:
    assert versions_sql("robots.episodes") == (
        'SELECT * FROM lake.robots."episodes$versions" ORDER BY engine_version'
    )
