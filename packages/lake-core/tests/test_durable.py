"""fsync_together: every path synced once, failures raised after all ended."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lake_core import durable


def test_fsync_together_syncs_every_file_and_directory_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = [tmp_path / f"f{i}" for i in range(3)]
    for path in files:
        path.write_bytes(b"x")
    synced: list[tuple[str, Path]] = []
    # Every fsync waits until all four are running: one after another, they would time out.
    together = threading.Barrier(4, timeout=30)
    real_file, real_dir = durable.fsync_file, durable.fsync_dir

    def on_file(path: str | Path) -> None:
        together.wait()
        real_file(path)
        synced.append(("file", Path(path)))

    def on_dir(path: str | Path) -> None:
        together.wait()
        real_dir(path)
        synced.append(("dir", Path(path)))

    monkeypatch.setattr(durable, "fsync_file", on_file)
    monkeypatch.setattr(durable, "fsync_dir", on_dir)
    durable.fsync_together(files, [tmp_path])
    assert sorted(synced) == sorted([("file", path) for path in files] + [("dir", tmp_path)])


def test_fsync_together_raises_the_failure_after_the_others_ended(tmp_path: Path) -> None:
    present = tmp_path / "present"
    present.write_bytes(b"x")
    with pytest.raises(FileNotFoundError):
        durable.fsync_together([present, tmp_path / "missing"], [tmp_path])
    durable.fsync_together()  # nothing to sync: returns
