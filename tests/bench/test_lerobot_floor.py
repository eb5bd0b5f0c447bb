"""The LeRobot export floor's copy does the work it claims: every byte copied and hashed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tools.bench.lerobot_bench import copy_verified, verified_copy


def test_verified_copy_writes_every_byte_and_returns_its_sha256(tmp_path: Path) -> None:
    for size in (0, 1, 1024 * 1024 - 1, 1024 * 1024, 3 * 1024 * 1024 + 17):
        data = os.urandom(size)
        source = tmp_path / f"in-{size}"
        source.write_bytes(data)
        digest = verified_copy(source, tmp_path / f"out-{size}")
        assert (tmp_path / f"out-{size}").read_bytes() == data
        assert digest == hashlib.sha256(data).hexdigest()


def test_copy_verified_keeps_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "videos"
    files = [root / "front" / "chunk-000" / "file-000.mp4", root / "wrist" / "file-001.mp4"]
    for n, path in enumerate(files):
        path.parent.mkdir(parents=True)
        path.write_bytes(bytes([n]) * (2_000_000 + n))
    copy_verified(files, root, tmp_path / "out")
    for path in files:
        assert (tmp_path / "out" / path.relative_to(root)).read_bytes() == path.read_bytes()
