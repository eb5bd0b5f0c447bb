"""Concurrent durable writes: every one runs, and a failure surfaces only once all ended."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lake_core.durable import Flushes, concurrently, replace_synced


def test_concurrently_runs_every_item_and_matches_a_loop(tmp_path: Path) -> None:
    bodies = {f"f{i}.json": f"body {i}".encode() * (i + 1) for i in range(37)}
    one_by_one, at_once = tmp_path / "loop", tmp_path / "concurrent"
    one_by_one.mkdir()
    at_once.mkdir()
    for name, body in bodies.items():
        replace_synced(one_by_one / name, [body])
    concurrently(lambda item: replace_synced(at_once / item[0], [item[1]]), bodies.items())
    assert sorted(p.name for p in at_once.iterdir()) == sorted(bodies)
    for name in bodies:
        assert (at_once / name).read_bytes() == (one_by_one / name).read_bytes()


def test_concurrently_runs_calls_at_the_same_time() -> None:
    inside, most = 0, 0
    lock = threading.Lock()

    def slow(_: int) -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.05)
        with lock:
            inside -= 1

    concurrently(slow, range(4))
    assert most > 1


def test_first_failure_is_raised_after_every_call_ended() -> None:
    ended: list[int] = []

    def work(item: int) -> None:
        if item in (3, 5):
            raise OSError(f"disk failed on {item}")
        time.sleep(0.02)
        ended.append(item)

    with pytest.raises(OSError, match="disk failed on 3"):
        concurrently(work, range(8))
    assert sorted(ended) == [0, 1, 2, 4, 6, 7]


def test_flushes_wait_for_writes_started_one_at_a_time() -> None:
    done: list[int] = []
    flushes = Flushes()
    for item in range(5):
        flushes.start(lambda i: (time.sleep(0.01), done.append(i)), item)
    flushes.wait()
    assert sorted(done) == list(range(5))
    flushes.wait()  # nothing left: returns at once
