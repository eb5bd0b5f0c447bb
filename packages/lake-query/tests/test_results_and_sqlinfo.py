"""Result batch sizing, GetSqlInfo's dense union and discovery patterns."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_query.flightsql.catalogs import like_matcher
from lake_query.flightsql.sqlinfo import SQL_INFO, SQL_INFO_SCHEMA, sql_info_batch
from lake_query.planning.batches import MAX_BATCH_BYTES, coalesce_batches, prefetch

SCHEMA = pa.schema([("x", pa.int64())])


def ints(n: int, start: int = 0) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int64())], schema=SCHEMA)


def test_small_batches_merge_and_empty_ones_vanish() -> None:
    # 8192-row batches of int64 are 64 KiB: 32 of them make one 2 MiB batch.
    parts = [ints(8192, i * 8192) for i in range(40)] + [ints(0)]
    out = list(coalesce_batches(parts, SCHEMA))
    assert [b.num_rows for b in out] == [32 * 8192, 8 * 8192]
    assert pa.Table.from_batches(out).column("x").to_pylist() == list(range(40 * 8192))


def test_megabyte_batches_pass_without_a_copy() -> None:
    # 1.5 MiB each: already a good message; merging two would copy both.
    parts = [ints(196_608, i * 196_608) for i in range(3)]
    out = list(coalesce_batches(parts, SCHEMA))
    assert [b.num_rows for b in out] == [196_608] * 3
    for got, sent in zip(out, parts, strict=True):
        assert got.column(0).buffers()[1].address == sent.column(0).buffers()[1].address
    # A small batch still merges with what follows it.
    out = list(coalesce_batches([ints(8192), *parts[:2]], SCHEMA))
    assert [b.num_rows for b in out] == [8192 + 196_608, 196_608]


def test_huge_batches_are_split() -> None:
    out = list(coalesce_batches([ints(2_000_000)], SCHEMA))  # 16 MB
    assert len(out) >= 4
    assert all(b.nbytes <= MAX_BATCH_BYTES for b in out)
    assert sum(b.num_rows for b in out) == 2_000_000


def test_batches_take_the_promised_schema() -> None:
    promised = pa.schema([pa.field("x", pa.int64(), metadata={"k": "v"})])
    (out,) = coalesce_batches([ints(3)], promised)
    assert out.schema.equals(promised, check_metadata=True)


def test_sql_info_union_has_every_child_in_proto_order() -> None:
    value = SQL_INFO_SCHEMA.field("value").type
    assert value.mode == "dense"
    assert [value.field(i).name for i in range(value.num_fields)] == [
        "string_value",
        "bool_value",
        "bigint_value",
        "int32_bitmask",
        "string_list",
        "int32_to_int32_list_map",
    ]
    assert value.type_codes == [0, 1, 2, 3, 4, 5]
    assert value.field(3).type == pa.int32()
    batch = sql_info_batch()
    batch.validate(full=True)
    assert batch.num_rows == len(SQL_INFO)


def test_sql_info_answers_what_adbc_asks_on_connect() -> None:
    batch = sql_info_batch([sql_pb.FLIGHT_SQL_SERVER_TRANSACTION])
    union = batch.column("value")
    assert batch.column("info_name").to_pylist() == [8]
    assert union.type_codes.to_pylist() == [3]  # int32_bitmask
    assert union.to_pylist() == [sql_pb.SQL_SUPPORTED_TRANSACTION_NONE]
    rows = sql_info_batch([sql_pb.SQL_KEYWORDS, sql_pb.FLIGHT_SQL_SERVER_READ_ONLY, 99_999])
    assert rows.column("info_name").to_pylist() == [sql_pb.SQL_KEYWORDS, 3]
    assert rows.column("value").to_pylist()[1] is True
    # SQL is read-only; bulk ingest (CommandStatementIngest) is how data comes in.
    ingest = sql_info_batch([sql_pb.FLIGHT_SQL_SERVER_BULK_INGESTION])
    assert ingest.column("value").to_pylist() == [True]


def test_like_patterns() -> None:
    matcher = like_matcher("rob_t%")
    assert matcher is not None
    assert matcher.fullmatch("robots")
    assert not matcher.fullmatch("xrobots")
    escaped = like_matcher(r"a\_b")
    assert escaped is not None
    assert escaped.fullmatch("a_b")
    assert not escaped.fullmatch("axb")
    assert like_matcher(None) is None


@pytest.mark.asyncio
async def test_prefetch_streams_in_order_and_propagates_errors() -> None:
    with ThreadPoolExecutor(2) as pool:
        assert [x async for x in prefetch(iter(range(50)), pool, depth=3)] == list(range(50))

        def failing() -> Iterator[int]:
            yield 1
            raise ValueError("scan failed")

        seen: list[int] = []

        async def consume() -> None:
            async for x in prefetch(failing(), pool):
                seen.append(x)

        with pytest.raises(ValueError, match="scan failed"):
            await consume()
        assert seen == [1]


@pytest.mark.asyncio
async def test_prefetch_stops_its_producer_when_the_reader_leaves() -> None:
    produced: list[int] = []

    def endless() -> Iterator[int]:
        for i in range(10**9):
            produced.append(i)
            yield i

    with ThreadPoolExecutor(1) as pool:
        stream = prefetch(endless(), pool, depth=2)
        async for x in stream:
            if x == 5:
                break
        await stream.aclose()
        await asyncio.sleep(0.3)
        # The producer stopped within its queue depth, not at a billion.
        assert len(produced) < 20


@pytest.mark.asyncio
async def test_prefetch_producer_runs_ahead_while_the_loop_is_busy() -> None:
    # While the event loop is busy (writing the previous message to a socket),
    # the producer must keep filling its buffer instead of waiting for the loop.
    produced: list[int] = []

    def counting() -> Iterator[int]:
        for i in range(100):
            produced.append(i)
            yield i

    with ThreadPoolExecutor(1) as pool:
        async with contextlib.aclosing(prefetch(counting(), pool, depth=4)) as stream:
            assert await stream.__anext__() == 0
            time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop, as a long socket write does
            assert len(produced) >= 5  # the item taken, plus a full buffer
            assert len(produced) <= 6  # and no further than its depth
            assert [x async for x in stream] == list(range(1, 100))
