"""verify_digest: a shipped segment is hashed as it streams, in bounded memory."""

from __future__ import annotations

import hashlib
import io
import tracemalloc
from typing import Any

import pytest

from lake_iceberg.errors import SegmentCorrupted
from lake_iceberg.registrar.digest import HASH_BLOCK, verify_digest
from lake_iceberg.registrar.segments import Uploaded

#: The object is this many blocks: far more than the memory the check may use.
BLOCKS = 64
PATTERN = bytes(range(256)) * (HASH_BLOCK // 256)


class _Body(io.RawIOBase):
    """A large object body produced on demand (never held whole)."""

    def __init__(self, blocks: int, flip_at: int | None = None) -> None:
        self._left = blocks
        self._flip_at = flip_at

    def read(self, size: int = -1) -> bytes:
        assert 0 < size <= HASH_BLOCK, "the body must be read in bounded blocks"
        if self._left == 0:
            return b""
        self._left -= 1
        if self._left == self._flip_at:
            return bytes([PATTERN[0] ^ 1]) + PATTERN[1:]
        return PATTERN


class _Client:
    def __init__(self, body: _Body) -> None:
        self.body = body

    def get_object(self, **_: Any) -> dict[str, Any]:
        return {"Body": self.body}


def _entry(blocks: int) -> Uploaded:
    sha = hashlib.sha256()
    for _ in range(blocks):
        sha.update(PATTERN)
    return Uploaded(
        "b", "p/lake/v1/x/d/1.parquet", "x", "d", "1.parquet", blocks * HASH_BLOCK, sha.hexdigest()
    )


def test_the_recorded_bytes_pass_in_bounded_memory() -> None:
    entry = _entry(BLOCKS)
    tracemalloc.start()
    try:
        verify_digest(_Client(_Body(BLOCKS)), entry)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert entry.size == BLOCKS * HASH_BLOCK
    assert peak < 4 * HASH_BLOCK, f"peak {peak} bytes hashing a {entry.size} byte object"


def test_one_changed_byte_is_refused_as_corrupted() -> None:
    with pytest.raises(SegmentCorrupted, match="SHA-256") as caught:
        verify_digest(_Client(_Body(BLOCKS, flip_at=BLOCKS // 2)), _entry(BLOCKS))
    assert caught.value.reason == "segments.corrupted"


@pytest.mark.parametrize("blocks", [BLOCKS - 1, BLOCKS + 1])
def test_a_short_or_long_object_is_refused_as_corrupted(blocks: int) -> None:
    with pytest.raises(SegmentCorrupted, match="bytes the shipper recorded"):
        verify_digest(_Client(_Body(blocks)), _entry(BLOCKS))
