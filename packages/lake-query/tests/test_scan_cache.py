"""The scan cache's bookkeeping: what it keeps, for how long, and what it counts.

Real Query processes serving repeated DoGets from it are in
``tests/readpath/test_scan_cache_process.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import lance
import numpy as np
import pyarrow as pa
import pytest

from lake_core.models import INCARNATION_PREFIX
from lake_query.planning.direct import DirectScan, batch_rows_for
from lake_query.planning.scan_cache import (
    BATCH_OVERHEAD_BYTES,
    ENTRY_OVERHEAD_BYTES,
    ScanCache,
    ScanKey,
    estimated_bytes,
    retained_bytes,
    scan_cache_bytes,
)

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float64())])
MIB = 1024 * 1024


def batch(rows: int, start: int = 0) -> pa.RecordBatch:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.RecordBatch.from_arrays([pa.array(ids), pa.array(ids * 0.5)], schema=SCHEMA)


def key(name: str = "t", *, version: int = 1, columns: tuple[str, ...] = ("id", "x")) -> ScanKey:
    return ScanKey(
        location=f"/data/{name}.lance",
        incarnation="inc-1",
        lance_version=version,
        columns=columns,
        row_filter=None,
        fragments=None,
        batch_rows=1024,
        schema=SCHEMA.serialize().to_pybytes(),
    )


def drain(batches: Iterator[pa.RecordBatch]) -> list[pa.RecordBatch]:
    return list(batches)


#: What keeping one 1 MiB batch costs.
UNIT = MIB + BATCH_OVERHEAD_BYTES


def kept(batches: int, name: str = "t") -> int:
    """What a kept scan of ``batches`` 1 MiB batches costs, key and entry included."""
    return batches * UNIT + ENTRY_OVERHEAD_BYTES + key(name).nbytes


def stream_of(mib: int) -> list[pa.RecordBatch]:
    """``mib`` batches of 1 MiB each (65,536 rows of two 8-byte columns)."""
    return [batch(65_536, i * 65_536) for i in range(mib)]


def test_a_scan_read_to_its_end_is_kept_and_replayed_unchanged() -> None:
    cache = ScanCache(64 * MIB)
    sent = stream_of(3)
    assert cache.replay(key()) is None
    assert drain(cache.keep(key(), iter(sent))) == sent
    replayed = cache.replay(key())
    assert replayed is not None
    got = drain(replayed)
    assert [b is s for b, s in zip(got, sent, strict=True)] == [True] * 3  # the same batches
    assert sum(b.nbytes for b in sent) == 3 * MIB
    assert cache.held_bytes == kept(3)
    assert len(cache) == 1


def test_keys_differ_in_everything_that_decides_the_rows() -> None:
    cache = ScanCache(64 * MIB)
    drain(cache.keep(key(), iter(stream_of(1))))
    assert cache.replay(key(version=2)) is None
    assert cache.replay(key(columns=("id",))) is None
    assert cache.replay(key("other")) is None
    assert cache.replay(key()) is not None


def test_a_stream_that_ends_early_or_fails_keeps_nothing() -> None:
    cache = ScanCache(64 * MIB)
    early = cache.keep(key(), iter(stream_of(3)))
    next(early)
    early.close()  # type: ignore[attr-defined]
    assert cache.held_bytes == 0
    assert cache.replay(key()) is None

    def failing() -> Iterator[pa.RecordBatch]:
        yield batch(10)
        raise OSError("storage went away")

    broken = cache.keep(key(), failing())
    with pytest.raises(OSError, match="storage went away"):
        drain(broken)
    assert cache.held_bytes == 0
    assert cache.replay(key()) is None


def test_a_scan_larger_than_the_cache_streams_whole_and_is_not_kept() -> None:
    cache = ScanCache(2 * MIB)
    sent = stream_of(3)
    got = []
    for one in cache.keep(key(), iter(sent)):
        assert cache.held_bytes <= 2 * MIB
        got.append(one)
    assert got == sent  # every batch still sent
    assert cache.replay(key()) is None
    assert cache.held_bytes == 0


def test_a_scan_known_to_be_too_large_is_not_tried_and_evicts_nothing() -> None:
    cache = ScanCache(2 * MIB)
    drain(cache.keep(key("small"), iter(stream_of(1))))
    sent = stream_of(3)
    assert drain(cache.keep(key(), iter(sent), estimate=3 * MIB)) == sent
    assert cache.replay(key()) is None
    assert cache.replay(key("small")) is not None
    assert cache.held_bytes == kept(1, "small")


def test_least_recently_used_scans_make_room() -> None:
    cache = ScanCache(3 * kept(1))
    for name in ("a", "b", "c"):
        drain(cache.keep(key(name), iter(stream_of(1))))
    drain(cache.replay(key("a")))  # type: ignore[arg-type]  # a is now the most recent
    drain(cache.keep(key("d"), iter(stream_of(1))))
    assert cache.replay(key("b")) is None  # the least recently used went
    for name in ("a", "c", "d"):
        assert cache.replay(key(name)) is not None
    assert cache.held_bytes == 3 * kept(1)


def test_a_scan_being_sent_is_not_evicted_and_bytes_never_pass_the_bound() -> None:
    cache = ScanCache(kept(2, "a"))
    drain(cache.keep(key("a"), iter(stream_of(2))))
    reading = cache.replay(key("a"))
    assert reading is not None
    next(reading)
    # No room while a is being sent: b streams whole and is not kept.
    sent = stream_of(1)
    assert drain(cache.keep(key("b"), iter(sent))) == sent
    assert cache.replay(key("b")) is None
    assert cache.held_bytes == kept(2, "a")
    reading.close()  # type: ignore[attr-defined]
    drain(cache.keep(key("b"), iter(stream_of(1))))
    assert cache.replay(key("b")) is not None
    assert cache.replay(key("a")) is None
    assert cache.held_bytes == kept(1, "b")


def test_scans_being_kept_count_against_the_bound() -> None:
    cache = ScanCache(3 * UNIT + ENTRY_OVERHEAD_BYTES + key("a").nbytes)
    first = cache.keep(key("a"), iter(stream_of(2)))
    second = cache.keep(key("b"), iter(stream_of(2)))
    next(first)
    next(second)
    next(first)
    assert cache.held_bytes == 3 * UNIT
    next(second)  # finds no room (a's fill holds it): b keeps nothing more
    assert cache.held_bytes == 2 * UNIT
    drain(first)
    drain(second)
    assert cache.replay(key("a")) is not None
    assert cache.replay(key("b")) is None


def test_one_fill_per_key_at_a_time() -> None:
    cache = ScanCache(64 * MIB)
    first = cache.keep(key(), iter(stream_of(2)))
    second = cache.keep(key(), iter(stream_of(2)))
    next(first)
    assert drain(second)  # streams without a copy
    assert cache.held_bytes == UNIT
    drain(first)
    assert cache.held_bytes == kept(2)


def test_slices_of_one_batch_count_its_buffers_once() -> None:
    whole = batch(100_000)
    seen: set[tuple[int, int]] = set()
    sliced = sum(retained_bytes(whole.slice(i, 10_000), seen) for i in range(0, 100_000, 10_000))
    assert sliced == whole.get_total_buffer_size()
    strings = pa.RecordBatch.from_pydict({"s": ["a" * 100] * 1000})
    assert retained_bytes(strings, set()) == strings.get_total_buffer_size()


def test_many_tiny_scans_are_bounded_by_their_entries_too() -> None:
    cache = ScanCache(64 * 1024)
    for n in range(100):
        drain(cache.keep(key(version=n), iter([batch(1, n)])))
        assert cache.held_bytes <= 64 * 1024
    assert 10 < len(cache) < 30


def test_zero_turns_the_cache_off_and_the_setting_is_checked() -> None:
    assert scan_cache_bytes({"LAKE_QUERY_SCAN_CACHE_BYTES": "0"}) == 0
    assert scan_cache_bytes({}) == 1024**3
    from lake_core.errors import ConfigError

    with pytest.raises(ConfigError, match="LAKE_QUERY_SCAN_CACHE_BYTES"):
        scan_cache_bytes({"LAKE_QUERY_SCAN_CACHE_BYTES": "-1"})
    with pytest.raises(ValueError, match="positive"):
        ScanCache(0)


def test_keys_and_size_estimates_come_from_the_opened_version(tmp_path) -> None:
    stamped = SCHEMA.with_metadata({INCARNATION_PREFIX + b"inc-7": b""})
    table = pa.Table.from_batches([batch(1000)]).cast(stamped)
    dataset = lance.write_dataset(table, tmp_path / "t.lance", max_rows_per_file=300)
    dataset.delete("id < 10")
    dataset = lance.dataset(str(tmp_path / "t.lance"))
    plan = DirectScan(["id", "x"], None, batch_rows_for(SCHEMA), SCHEMA)
    whole = ScanKey.of(dataset, plan)
    assert whole is not None
    assert (whole.incarnation, whole.lance_version, whole.fragments) == ("inc-7", 2, None)
    assert ScanKey.of(dataset, plan, [0]) != whole
    assert estimated_bytes(dataset, plan) == 990 * 16
    assert estimated_bytes(dataset, plan, [1]) == 300 * 16
    filtered = DirectScan(["id", "x"], "id > 5", plan.batch_rows, SCHEMA)
    assert estimated_bytes(dataset, filtered) is None
    assert ScanKey.of(dataset, filtered) != whole
    lookup = DirectScan(["id", "x"], "(`id` = 5)", plan.batch_rows, SCHEMA, cacheable=False)
    assert ScanKey.of(dataset, lookup) is None  # key lookups are never kept
    unstamped = lance.write_dataset(pa.Table.from_batches([batch(5)]), tmp_path / "u.lance")
    assert ScanKey.of(unstamped, plan) is None
