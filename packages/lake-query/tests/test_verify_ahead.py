"""VerifyAhead: new versions of warm tables opened in the background, newest only."""

from __future__ import annotations

import threading
from typing import Any

from lake_core.errors import DataCorrupted
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_query.planning.verify_ahead import VerifyAhead
from tools.lake_testing.waiting import until

WARM = TableRef("fleet", "episodes")
COLD = TableRef("fleet", "calibrations")


def descriptor(table: TableRef, version: int) -> TableDescriptor:
    return TableDescriptor(
        location=f"/data/{table.name}.lance",
        engine="lance",
        engine_version=version,
        version=version,
        incarnation="i1",
    )


class FakeOpener:
    """Records what was opened ahead; ``gate`` holds the first open until released."""

    def __init__(self, warm: set[str]) -> None:
        self.warm = warm
        self.opened: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_versions: set[int] = set()

    def read_within(self, d: TableDescriptor, seconds: float) -> bool:
        return d.location in self.warm

    def open(self, table: TableRef, d: TableDescriptor, *, ahead: bool = False) -> Any:
        assert ahead
        self.gate.wait(10)
        if d.version in self.fail_versions:
            raise DataCorrupted("a data file is not what its commit wrote")
        self.opened.append((table.name, d.version))
        return object()


def test_only_tables_read_lately_are_opened_ahead() -> None:
    opener = FakeOpener({descriptor(WARM, 1).location})
    ahead = VerifyAhead(opener)
    ahead.start()
    try:
        ahead.offer(COLD, descriptor(COLD, 5))
        ahead.offer(WARM, descriptor(WARM, 2))
        until(lambda: ahead.opened == 1 and ahead.idle(), 10, "the warm table opened")
        assert opener.opened == [("episodes", 2)]
    finally:
        ahead.close()


def test_only_the_newest_pending_version_is_opened() -> None:
    opener = FakeOpener({descriptor(WARM, 1).location})
    opener.gate.clear()
    ahead = VerifyAhead(opener)
    ahead.start()
    try:
        ahead.offer(WARM, descriptor(WARM, 2))  # taken at once, held at the gate
        until(lambda: not ahead.idle() and not ahead._pending, 10, "version 2 taken")
        for version in (3, 4, 5):
            ahead.offer(WARM, descriptor(WARM, version))
        opener.gate.set()
        until(lambda: ahead.idle(), 10, "the queue drained")
        assert opener.opened == [("episodes", 2), ("episodes", 5)]
    finally:
        ahead.close()


def test_a_failed_check_is_counted_and_the_thread_goes_on() -> None:
    opener = FakeOpener({descriptor(WARM, 1).location})
    opener.fail_versions = {2}
    ahead = VerifyAhead(opener)
    ahead.start()
    try:
        ahead.offer(WARM, descriptor(WARM, 2))
        until(lambda: ahead.failed == 1 and ahead.idle(), 10, "the failure counted")
        ahead.offer(WARM, descriptor(WARM, 3))
        until(lambda: ahead.opened == 1, 10, "the next version opened")
        assert opener.opened == [("episodes", 3)]
    finally:
        ahead.close()


def test_close_stops_the_thread_and_later_offers_are_dropped() -> None:
    opener = FakeOpener({descriptor(WARM, 1).location})
    ahead = VerifyAhead(opener)
    ahead.start()
    ahead.close()
    assert ahead._thread is not None
    assert not ahead._thread.is_alive()
    ahead.offer(WARM, descriptor(WARM, 2))
    assert ahead.idle()
    assert opener.opened == []
