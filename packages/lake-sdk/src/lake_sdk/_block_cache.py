"""The block cache behind :class:`~lake_sdk.ObjectFile`: one immutable object in fixed blocks.

Planning is pure bookkeeping: for a read at ``offset`` the cache says which
exact ranges to fetch (missing blocks coalesced, plus read-ahead while reads
are sequential) and takes the fetched bytes back. It holds at most
``cache_bytes`` of blocks, least recently used first out.

Integrity: blocks joining the contiguous prefix from byte 0 are hashed in
order as they arrive, so a sequential read to EOF proves the declared size
and SHA-256 exactly as a whole-object reader does, whatever the cache
evicted meanwhile. A random-access reader proves only that each range had
exactly its length (storage checked that per fetch).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from lake_core.errors import InvalidArgument
from lake_core.models import DataLocation
from lake_objects.errors import HashMismatch, ObjectIntegrityError, PrematureEof

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_READ_AHEAD",
    "MAX_BLOCK_SIZE",
    "MAX_CACHE_BYTES",
    "MIN_BLOCK_SIZE",
    "BlockCache",
    "CacheLimits",
]

KIB = 1024
MIB = 1024 * KIB
#: One block is the least a cache miss fetches: one S3 Range GET's worth of bytes.
DEFAULT_BLOCK_SIZE = 1 * MIB
#: Blocks kept per open file (a few GOPs of a typical episode video).
DEFAULT_CACHE_BYTES = 32 * MIB
#: The most fetched beyond a sequential read; it grows with the sequential run.
DEFAULT_READ_AHEAD = 8 * MIB
MIN_BLOCK_SIZE = 64 * KIB
MAX_BLOCK_SIZE = 16 * MIB
#: The ceiling for one open file's cache, whatever the caller asks.
MAX_CACHE_BYTES = 64 * MIB


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer number of bytes, got {value!r}")
    return value


@dataclass(frozen=True)
class CacheLimits:
    """Validated sizes: ``block_size`` per fetch at least, ``cache_bytes`` held, ``read_ahead``."""

    block_size: int = DEFAULT_BLOCK_SIZE
    cache_bytes: int = DEFAULT_CACHE_BYTES
    read_ahead: int = DEFAULT_READ_AHEAD

    @classmethod
    def create(
        cls,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        read_ahead: int | None = None,
    ) -> CacheLimits:
        """``read_ahead`` defaults to :data:`DEFAULT_READ_AHEAD` or half the cache, if less."""
        block = _whole(block_size, "block_size")
        cache = _whole(cache_bytes, "cache_bytes")
        if read_ahead is None:
            read_ahead = min(DEFAULT_READ_AHEAD, cache // 2)
        ahead = _whole(read_ahead, "read_ahead")
        if not MIN_BLOCK_SIZE <= block <= MAX_BLOCK_SIZE:
            raise InvalidArgument(
                f"block_size must be in {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}, got {block}"
            )
        if not 2 * block <= cache <= MAX_CACHE_BYTES:
            raise InvalidArgument(
                f"cache_bytes must be in 2 * block_size ({2 * block})..={MAX_CACHE_BYTES}, "
                f"got {cache}"
            )
        # Half the cache for the read itself, half for read-ahead: neither evicts the other.
        if not 0 <= ahead <= cache // 2:
            raise InvalidArgument(f"read_ahead must be in 0..={cache // 2} (cache_bytes / 2)")
        return cls(block, cache, ahead)

    @property
    def blocks(self) -> int:
        return self.cache_bytes // self.block_size


class BlockCache:
    """Blocks of one object, what to fetch next, and the running prefix hash."""

    def __init__(self, location: DataLocation, limits: CacheLimits) -> None:
        self.location = location
        self.size = location.size_bytes
        self.limits = limits
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._held = 0
        self.peak_bytes = 0
        self.bytes_fetched = 0
        self.fetches = 0
        self._hasher = hashlib.sha256()
        self._hashed = 0
        self.verified = False
        self._failure: ObjectIntegrityError | None = None
        self._run_end = -1
        self._run = 0

    @property
    def cached_bytes(self) -> int:
        return self._held

    def _block_end(self, index: int) -> int:
        return min((index + 1) * self.limits.block_size, self.size)

    def check(self) -> None:
        """Raise the integrity failure this object already showed, if any."""
        if self._failure is not None:
            raise self._failure
        if self.size == 0 and not self.verified:
            self._finish()

    def note_read(self, offset: int) -> None:
        """Track sequential runs: read-ahead grows with the bytes read without a seek."""
        if offset != self._run_end:
            self._run = 0
            self._run_end = offset

    def note_consumed(self, offset: int, count: int) -> None:
        if offset == self._run_end:
            self._run += count
            self._run_end = offset + count

    def plan(self, offset: int, size: int) -> tuple[int, list[tuple[int, int]]]:
        """For a read at ``offset`` (< size) of up to ``size`` bytes: this step's end, and fetches.

        A step covers at most half the cache, so its blocks and its read-ahead
        fit together and the cache never holds more than ``cache_bytes``.
        """
        block = self.limits.block_size
        first = offset // block
        half = max(1, self.limits.blocks // 2)
        end = min(offset + size, self.size, (first + half) * block)
        last = (end - 1) // block
        needed = [i for i in range(first, last + 1) if i not in self._blocks]
        if not needed:
            return end, []
        ahead_blocks = min(self._run, self.limits.read_ahead) // block
        final = (self.size - 1) // block
        extra = last
        while extra < min(last + ahead_blocks, final) and extra + 1 not in self._blocks:
            extra += 1
        wanted = needed + list(range(last + 1, extra + 1))
        ranges: list[tuple[int, int]] = []
        run_start = prev = wanted[0]
        for index in wanted[1:]:
            if index != prev + 1:
                ranges.append((run_start * block, self._block_end(prev)))
                run_start = index
            prev = index
        ranges.append((run_start * block, self._block_end(prev)))
        return end, ranges

    def store(self, start: int, data: bytes, touch: range) -> None:
        """Keep a fetched range (block aligned, exactly its length) and advance the hash."""
        block = self.limits.block_size
        self.bytes_fetched += len(data)
        self.fetches += 1
        view = memoryview(data)
        index = start // block
        # The read's own blocks and this fetch's stay; a plan never holds more than the cache.
        keep = set(touch) | set(range(index, index + -(-len(data) // block)))
        position = 0
        while position < len(data):
            length = self._block_end(index) - index * block
            piece = bytes(view[position : position + length])
            if len(piece) != length:
                raise PrematureEof(
                    f"range {start}..{start + len(data)} of {self.location.uri!r} ended early",
                    uri=self.location.uri,
                )
            self._put(index, piece, keep)
            index += 1
            position += length
        for needed in touch:  # the read's own blocks are the most recently used
            if needed in self._blocks:
                self._blocks.move_to_end(needed)
        self._advance_hash()

    def _put(self, index: int, piece: bytes, keep: set[int]) -> None:
        old = self._blocks.pop(index, None)
        if old is not None:
            self._held -= len(old)
        # Evict before adding, least recently used first, so the bound holds at every moment.
        for victim in [i for i in self._blocks if i not in keep]:
            if self._held + len(piece) <= self.limits.cache_bytes:
                break
            self._held -= len(self._blocks.pop(victim))
        self._blocks[index] = piece
        self._held += len(piece)
        self.peak_bytes = max(self.peak_bytes, self._held)

    def _advance_hash(self) -> None:
        block = self.limits.block_size
        while not self.verified and self._failure is None:
            piece = self._blocks.get(self._hashed // block)
            if piece is None:
                return
            self._hasher.update(piece)
            self._hashed += len(piece)
            if self._hashed >= self.size:
                self._finish()

    def _finish(self) -> None:
        if self._hasher.hexdigest() != self.location.sha256:
            self._failure = HashMismatch(
                f"object {self.location.uri!r} has {self.size} bytes but not its declared SHA-256",
                uri=self.location.uri,
            )
            raise self._failure
        self.verified = True

    def copy(self, offset: int, end: int, out: memoryview) -> int:
        """Copy cached bytes ``offset..end`` into ``out``; every block must be cached."""
        block = self.limits.block_size
        written = 0
        position = offset
        while position < end:
            index = position // block
            piece = self._blocks[index]
            self._blocks.move_to_end(index)
            inner = position - index * block
            take = min(len(piece) - inner, end - position)
            out[written : written + take] = piece[inner : inner + take]
            written += take
            position += take
        return written

    def peek(self, offset: int) -> bytes:
        """The cached bytes from ``offset`` to the end of its block (b"" when not cached)."""
        block = self.limits.block_size
        piece = self._blocks.get(offset // block)
        return b"" if piece is None else piece[offset % block :]

    def clear(self) -> None:
        self._blocks.clear()
        self._held = 0
