"""What the local stage inventories and what GC may ever delete."""

from __future__ import annotations

import os
from pathlib import Path

from lake_gc.stage import Entry, LocalStage


def test_only_managed_object_names_are_owned(tmp_path: Path) -> None:
    stage = LocalStage(str(tmp_path))
    base = f"file://{tmp_path}/tenants"
    assert stage.owns(f"{base}/acme/objects/0190")
    assert stage.owns(f"{base}/acme/objects/.0190.partial")
    for uri in (
        f"{base}/episodes.lance/data/x.lance",  # a table of a namespace called "tenants"
        f"{base}/acme/objects/..",
        f"{base}/acme/objects/a/b",
        f"{base}/acme/other/x",
        f"{base}/acme/objects/a\nb",
        f"file://{tmp_path}/elsewhere/acme/objects/x",
    ):
        assert not stage.owns(uri), uri


def test_inventory_walks_files_and_skips_symlinks(tmp_path: Path) -> None:
    objects = tmp_path / "tenants" / "acme" / "objects"
    objects.mkdir(parents=True)
    (objects / "a").write_bytes(b"12")
    (objects / ".b.partial").write_bytes(b"1")
    os.symlink("/etc/hostname", objects / "link")
    entries = sorted(LocalStage(str(tmp_path)).entries(), key=lambda e: e.uri)
    assert [(Path(e.uri).name, e.size, e.kind) for e in entries] == [
        (".b.partial", 1, "partial"),
        ("a", 2, "object"),
    ]
    assert Entry.from_line(entries[0].line()) == entries[0]


def test_deleting_an_absent_object_is_a_success(tmp_path: Path) -> None:
    objects = tmp_path / "tenants" / "acme" / "objects"
    objects.mkdir(parents=True)
    (objects / "a").write_bytes(b"x")
    stage = LocalStage(str(tmp_path))
    entries = [Entry(f"file://{objects}/a", 1, 0), Entry(f"file://{objects}/gone", 1, 0)]
    outcome = stage.delete(entries)
    assert (outcome.deleted, outcome.absent) == (1, 1)
    assert not (objects / "a").exists()
