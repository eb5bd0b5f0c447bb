"""The external sorter agrees with ``sorted(set(...))`` over runs, merge rounds and repeats."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from lake_gc import sorter
from lake_gc.sorter import ExternalSorter


@pytest.mark.parametrize(("count", "run_lines"), [(0, 10), (7, 10), (5_000, 97), (20_000, 50)])
def test_merged_is_sorted_and_distinct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, run_lines: int
) -> None:
    monkeypatch.setattr(sorter, "FAN_IN", 4)  # forces merge rounds of intermediate runs
    rng = random.Random(count)
    lines = [
        f"s3://b/tenants/t/objects/{rng.randrange(count or 1):06d}\t{i % 3}" for i in range(count)
    ]
    lines += ["file:///r/ü", "a", "a\tb", "a/b"]
    sort = ExternalSorter(tmp_path, run_lines=run_lines)
    sort.add_all(lines)
    assert list(sort.merged()) == sorted(set(lines))
    assert list(tmp_path.iterdir()) == []  # every run file is gone


def test_tab_sorts_before_every_uri_character() -> None:
    # Sorting "<uri>\t<fields>" lines must order them by URI alone.
    uris = sorted(["s3://b/a", "s3://b/a/b", "s3://b/a-b", "s3://b/a b", "s3://b/a!"])
    assert [line.split("\t")[0] for line in sorted(u + "\t9" for u in uris)] == uris
