"""Where a time-travel walk starts: what MetaVersionStarts asks Metasrv, and what it ignores."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from lake_core import protocol
from lake_core.errors import Unavailable, Unimplemented
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_query.planning.version_starts import MARGIN_MS, NEAR_HEAD, MetaVersionStarts
from lake_query.planning.versions import parse_table_name
from tools.lake_testing.loops import loop_on_thread

T = TableRef("robots", "episodes")
HEAD = TableDescriptor(
    location="/data/robots/episodes.lance",
    engine="lance",
    version=100,
    engine_version=140,
    incarnation="0193a3b4-0000-7000-8000-000000000000",
)


class FakeMeta:
    """Answers lake.table_version as told, recording every request."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[protocol.TableVersionRequest] = []

    async def action(self, name: str, body: Any, result: type[Any]) -> Any:
        assert name == protocol.TABLE_VERSION
        self.asked.append(body)
        if isinstance(self.answer, BaseException):
            raise self.answer
        if self.answer == "hang":
            await asyncio.sleep(60)
        return result(**self.answer)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    with loop_on_thread() as running:
        yield running


def test_a_far_version_starts_at_metasrvs_record(loop: asyncio.AbstractEventLoop) -> None:
    meta = FakeMeta({"version": 7, "engine_version": 9})
    start = MetaVersionStarts(meta, loop)(T, HEAD, parse_table_name("t@v7"))
    assert start == HEAD.model_copy(update={"version": 7, "engine_version": 9})
    (asked,) = meta.asked
    assert (asked.version, asked.newest, asked.incarnation) == (7, 100, HEAD.incarnation)


def test_an_instant_asks_for_the_first_version_after_it_plus_the_margin(
    loop: asyncio.AbstractEventLoop,
) -> None:
    meta = FakeMeta({"version": 40, "engine_version": 52})
    instant = datetime(2026, 12, 1, 12, 0, 0, 250_000, tzinfo=UTC)
    text = "t@" + instant.isoformat().replace("+00:00", "Z")
    start = MetaVersionStarts(meta, loop)(T, HEAD, parse_table_name(text))
    assert start is not None
    assert start.version == 40
    assert meta.asked[0].after_ms == int(instant.timestamp() * 1000) + MARGIN_MS


def test_near_the_head_and_before_1970_nothing_is_asked(loop: asyncio.AbstractEventLoop) -> None:
    meta = FakeMeta({"version": 1, "engine_version": 1})
    starts = MetaVersionStarts(meta, loop)
    for text in (f"t@v{100 - NEAR_HEAD}", "t@v100", "t@v101", "t@1969-12-31T23:59:00Z"):
        assert starts(T, HEAD, parse_table_name(text)) is None
    assert meta.asked == []


@pytest.mark.parametrize(
    "answer",
    [
        {},  # no record
        {"version": 100, "engine_version": 140},  # the head itself
        {"version": 7, "engine_version": 141},  # newer than the pin
    ],
)
def test_answers_no_shorter_than_the_head_are_ignored(
    loop: asyncio.AbstractEventLoop, answer: dict[str, int]
) -> None:
    assert MetaVersionStarts(FakeMeta(answer), loop)(T, HEAD, parse_table_name("t@v7")) is None


def test_an_old_metasrv_is_asked_once_and_failures_walk_from_the_head(
    loop: asyncio.AbstractEventLoop,
) -> None:
    old = FakeMeta(Unimplemented("unknown action 'lake.table_version'"))
    starts = MetaVersionStarts(old, loop)
    assert starts(T, HEAD, parse_table_name("t@v7")) is None
    assert starts(T, HEAD, parse_table_name("t@v8")) is None
    assert len(old.asked) == 1
    down = FakeMeta(Unavailable("Metasrv is restarting"))
    starts = MetaVersionStarts(down, loop)
    for _ in range(2):
        assert starts(T, HEAD, parse_table_name("t@v7")) is None
    assert len(down.asked) == 2  # a passing outage: asked again next time
    slow = MetaVersionStarts(FakeMeta("hang"), loop, timeout_s=0.2)
    assert slow(T, HEAD, parse_table_name("t@v7")) is None
