"""No statement takes a real Query replica down, exhausts its memory or is answered INTERNAL.

A seeded, deterministic corpus of more than 5,000 statements (grammar-based
mutations of valid SELECTs over a table of every plain column type, random
bytes, deep nesting of every form (tools/lake_testing/nesting.py), long operator chains, huge IN lists, recursive CTEs,
file-reading functions, information_schema, SET/EXPLAIN/PREPARE) runs over
one gRPC connection against a real ``lake query`` process. Every reply must
be OK or a typed client error (never INTERNAL or UNKNOWN, and never
UNAVAILABLE, which is what a dead replica answers), no reply may carry the
content of a local canary file, no error may carry engine internals (panic
text, Rust sources or build paths, storage URIs or the data directory), the
process must be alive at the end, and its RSS must stay under the bound
configured for it. Then memory-heavy queries run concurrently against it:
each is served (spilling) or refused cleanly, and the RSS stays bounded.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from lake_core import protocol
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.names import TableRef
from lake_core.proto import flight_grpc
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from tools.lake_testing.nesting import FORMS, HANGS, nest, nested_statement
from tools.lake_testing.plugin import LakeCluster

pytestmark = pytest.mark.slow

SEED = 11_2026
CORPUS = 5_200
MEMORY_LIMIT = 512 * 1024 * 1024
#: The replica's RSS bound: its DataFusion memory plus Python, gRPC and Lance.
RSS_BOUND = MEMORY_LIMIT + 1024 * 1024 * 1024
CANARY = "lake-canary-7f3a9c"

TYPES = pa.schema(
    [
        ("id", pa.int64()),
        ("i32", pa.int32()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("s", pa.utf8()),
        ("ok", pa.bool_()),
        ("at", pa.timestamp("us", tz="UTC")),
    ]
)
ROWS = 200

#: Statements the issue names; they must be in every run.
CHAIN_3000 = "SELECT " + "+".join(["1"] * 3000)
CHAIN_20000 = "SELECT " + "+".join(["1"] * 20000)
REPEAT = "SELECT length(repeat('x', 1500000000))"
REPEAT_100M = "SELECT length(repeat('x', 100000000))"
LPAD = "SELECT length(lpad('x', 1500000000))"
RPAD = "SELECT length(rpad(s, 100000000, 'ab')) FROM fuzz.types"
ARRAY_RESIZE = "SELECT cardinality(array_resize(make_array(1), 1000000000, 0))"
#: Concatenation amplifying a bounded value: doubled by 12 chained CTEs, and 400 operands.
CONCAT_DOUBLING_12 = (
    "WITH c0 AS (SELECT repeat('x', 50000000) AS s), "
    + ", ".join(f"c{i} AS (SELECT s || s AS s FROM c{i - 1})" for i in range(1, 13))
    + " SELECT length(s) FROM c12"
)
CONCAT_LINEAR_400 = "SELECT length(" + " || ".join(["repeat('x', 50000000)"] * 400) + ")"
NAMED = {
    "chain-3000": CHAIN_3000,
    "chain-20000": CHAIN_20000,
    "repeat": REPEAT,
    "repeat-100m": REPEAT_100M,
    "lpad": LPAD,
    "rpad": RPAD,
    "array-resize": ARRAY_RESIZE,
    "concat-doubling-12": CONCAT_DOUBLING_12,
    "concat-linear-400": CONCAT_LINEAR_400,
    **HANGS,
}
#: What no client-visible error may contain (the data directory is added per run).
INTERNALS = ("/root/.cargo", ".rs:", "panicked", "s3://", "file://", "RUST_BACKTRACE")

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _types_batch() -> pa.RecordBatch:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    special = [float("nan"), float("inf"), float("-inf"), -0.0, None]
    return pa.record_batch(
        [
            pa.array(range(ROWS), pa.int64()),
            pa.array([i * 7 - 500 for i in range(ROWS)], pa.int32()),
            pa.array([special[i] if i < 5 else i / 4 for i in range(ROWS)], pa.float32()),
            pa.array([special[i % 5] if i % 9 == 0 else i / 3 for i in range(ROWS)]),
            pa.array([None if i % 11 == 0 else f"s-{i}-ž日" for i in range(ROWS)]),
            pa.array([None if i % 13 == 0 else i % 2 == 0 for i in range(ROWS)]),
            pa.array([base + timedelta(minutes=i) for i in range(ROWS)], TYPES.field("at").type),
        ],
        schema=TYPES,
    )


BASES = [
    "SELECT * FROM fuzz.types",
    "SELECT id, s FROM fuzz.types WHERE f32 > 1.5 AND ok",
    "SELECT count(*), sum(f64), avg(i32) FROM fuzz.types",
    "SELECT s, count(*) FROM fuzz.types GROUP BY s ORDER BY 2 DESC LIMIT 5",
    "SELECT a.id, b.s FROM fuzz.types a JOIN fuzz.types b ON a.id = b.id + 1",
    "WITH t AS (SELECT id * 2 AS x FROM fuzz.types) SELECT max(x) FROM t",
    "SELECT id FROM fuzz.types WHERE id IN (1, 2, 3) OR s LIKE 's-1%'",
    "SELECT at, f64 FROM fuzz.types WHERE at > TIMESTAMP '2026-01-01T01:00:00Z'",
    "SELECT CASE WHEN f32 > 10 THEN 'big' ELSE 'small' END FROM fuzz.types",
    "SELECT upper(s), length(s), substr(s, 2, 3) FROM fuzz.types",
    "SELECT id, row_number() OVER (PARTITION BY ok ORDER BY id) FROM fuzz.types",
    "SELECT * FROM fuzz.types WHERE f64 IS NULL OR f64 != f64",
    "SELECT cast(f64 AS int) FROM fuzz.types",
    "SELECT id / (i32 - i32) FROM fuzz.types",
    "SELECT * FROM fuzz.types ORDER BY s NULLS FIRST LIMIT 3 OFFSET 2",
    "SELECT DISTINCT ok FROM fuzz.types",
    "SELECT $1",
    "SELECT id FROM fuzz.types WHERE id = $1",
]
TOKENS = [
    "SELECT",
    "FROM",
    "WHERE",
    "(",
    ")",
    ",",
    "*",
    "+",
    "-",
    "/",
    "%",
    "||",
    "=",
    "<",
    ">",
    "AND",
    "OR",
    "NOT",
    "NULL",
    "IN",
    "LIKE",
    "CASE",
    "WHEN",
    "THEN",
    "END",
    "GROUP BY",
    "ORDER BY",
    "LIMIT",
    "UNION ALL",
    "JOIN",
    "ON",
    "'x'",
    "1e39",
    "-0.0",
    "'NaN'",
    "9223372036854775808",
    "fuzz.types",
    "id",
    "s",
    "f32",
    "at",
    "$1",
    "$2",
    ";",
    "--",
    "/*",
    "'",
    '"',
    "`",
    "\\",
    "\x00",
    "日本",
    "repeat('y', 100000000)",
    "range(1, 100000000)",
    "array_repeat(1, 100000000)",
    "generate_series(1, 100000000)",
]
SPECIAL = [
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM information_schema.columns",
    "SHOW TABLES",
    "SET datafusion.execution.target_partitions = 1",
    "SET datafusion.runtime.memory_limit = '100G'",
    "EXPLAIN SELECT * FROM fuzz.types",
    "EXPLAIN ANALYZE SELECT count(*) FROM fuzz.types",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
    "SELECT * FROM '{canary}'",
    "SELECT * FROM read_csv('{canary}')",
    "SELECT * FROM read_parquet('{canary}')",
    "SELECT * FROM '{canary}'::text",
    "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{canary}'",
    "COPY (SELECT 1) TO '{canary}.out'",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10000) "
    "SELECT count(*) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
    "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) SELECT length(s) FROM r",
    "SELECT length(repeat(repeat('x', 1000000), 1000))",
    "SELECT array_repeat(1, 1000000000)",
    "SELECT range(0, 1000000000)",
    "SELECT generate_series(1, 1000000000)",
    "SELECT count(*) FROM generate_series(1, 100000)",
    "SELECT string_agg(s, ',') FROM fuzz.types a, fuzz.types b",
    "SELECT count(*) FROM fuzz.types a, fuzz.types b, fuzz.types c",
]


def _mutate(rng: random.Random, sql: str) -> str:
    words = sql.split(" ")
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        position = rng.randrange(len(words) + 1)
        if roll < 0.35:
            words.insert(position, rng.choice(TOKENS))
        elif roll < 0.6 and len(words) > 1:
            del words[min(position, len(words) - 1)]
        elif roll < 0.8:
            words[min(position, len(words) - 1)] = rng.choice(TOKENS)
        else:
            cut = rng.randrange(len(words))
            words = words[:cut] + words[cut:] * 2
    return " ".join(words)


def corpus(canary: Path) -> Iterator[str | bytes]:
    rng = random.Random(SEED)
    yield from NAMED.values()
    for special in SPECIAL:
        yield special.format(canary=canary)
    for n in (10, 100, 600, 2000, 5000):
        yield "SELECT * FROM fuzz.types WHERE " + " OR ".join(f"id = {i}" for i in range(n))
        yield "SELECT " + " || ".join(["s"] * n) + " FROM fuzz.types"
        yield "SELECT " + "(" * min(n, 500) + "1" + ")" * min(n, 500)
        yield "SELECT " + "NOT " * n + "true"
        yield "SELECT * FROM fuzz.types WHERE id IN (" + ", ".join(map(str, range(n * 10))) + ")"
        ctes = ", ".join(f"c{i} AS (SELECT id + 1 AS id FROM c{i - 1})" for i in range(1, n // 10))
        yield f"WITH c0 AS (SELECT id FROM fuzz.types), {ctes} SELECT * FROM c{n // 10 - 1}"
        yield " UNION ALL ".join(["SELECT id FROM fuzz.types"] * (n // 10))
    # Nesting of every form, alone and mixed, around the guard and past the parser's limit.
    nesting = 0
    for form in sorted(FORMS):
        for depth in (8, 20, 31, 48, 49, 60):
            yield "SELECT " + nest([form] * depth)
            nesting += 1
    for _ in range(150):
        yield nested_statement(rng, rng.randint(1, 70), mixed=True)
        nesting += 1
    produced = len(NAMED) + len(SPECIAL) + 5 * 7 + nesting
    for _ in range(CORPUS - produced):
        roll = rng.random()
        if roll < 0.08:
            yield bytes(rng.randrange(256) for _ in range(rng.randint(1, 80)))
        elif roll < 0.12:
            yield "SELECT '" + "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(20)) + "'"
        else:
            yield _mutate(rng, rng.choice(BASES + SPECIAL[:9]))


def _command(sql: str | bytes) -> bytes:
    """A CommandStatementQuery; bytes are sent as they are, UTF-8 or not."""
    raw = sql.encode() if isinstance(sql, str) else sql
    body = sql_pb.CommandStatementQuery().SerializeToString()
    length = len(raw)
    varint = bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    body = b"\x0a" + bytes(varint) + raw  # field 1 (query), length-delimited
    wrapper = any_pb2.Any(
        type_url="type.googleapis.com/" + sql_pb.CommandStatementQuery.DESCRIPTOR.full_name,
        value=body,
    )
    return wrapper.SerializeToString()


async def _run(stub: object, sql: str | bytes) -> tuple[grpc.StatusCode, str]:
    descriptor = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=_command(sql))
    try:
        info = await stub.GetFlightInfo(descriptor, timeout=60)  # type: ignore[attr-defined]
        replies = []
        async for data in stub.DoGet(info.endpoint[0].ticket, timeout=60):  # type: ignore[attr-defined]
            replies.append(bytes(data.data_body[:4096]))
        return grpc.StatusCode.OK, b"".join(replies).decode("latin-1")
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def fuzz_cluster(tmp_path: Path) -> Iterator[LakeCluster]:
    env = {
        "LAKE_QUERY_MEMORY_LIMIT_BYTES": str(MEMORY_LIMIT),
        "LAKE_QUERY_EXECUTION_TIMEOUT_MS": "5000",
        # A statement the nesting guard missed fails the run instead of hanging it.
        "LAKE_QUERY_PLANNING_TIMEOUT_MS": "10000",
    }
    cluster = LakeCluster.start(tmp_path, env, meta_env={})
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_hostile_corpus_never_crashes_or_reads_files(
    fuzz_cluster: LakeCluster, tmp_path: Path
) -> None:
    canary = tmp_path / "canary.csv"
    canary.write_text(f"secret\n{CANARY}\n")
    query = fuzz_cluster.query

    async def scenario() -> tuple[Counter[grpc.StatusCode], list[str], int, dict[str, str]]:
        async with MetaClient(f"http://{fuzz_cluster.meta.addr}") as meta:
            await meta.create_table(TableRef("fuzz", "types"), TYPES)
        async with MetaClient(query.url) as client:
            command = protocol.AppendCommand(
                table=TableRef("fuzz", "types"), operation_id=new_operation_id()
            )
            await client.append(command, TYPES, [_types_batch()])
        codes: Counter[grpc.StatusCode] = Counter()
        internals = (*INTERNALS, str(tmp_path / "data"))
        bad: list[str] = []
        named: dict[str, str] = {}
        peak = 0
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        async with grpc.aio.insecure_channel(query.addr, options=options) as channel:
            stub = flight_grpc.FlightServiceStub(channel)
            for i, sql in enumerate(corpus(canary)):
                code, text = await _run(stub, sql)
                codes[code] += 1
                leaked = code != grpc.StatusCode.OK and any(m in text for m in internals)
                # Planning always ends: the nesting guard, not the planning deadline.
                stuck = "LAKE_QUERY_PLANNING_TIMEOUT_MS" in text
                if code not in ALLOWED or CANARY in text or leaked or stuck:
                    bad.append(f"{code.name}: {str(sql)[:120]!r}: {text[:200]}")
                for label, named_sql in NAMED.items():
                    if sql == named_sql:
                        named[label] = code.name
                if i % 100 == 0:
                    peak = max(peak, _rss(query.pid))
        return codes, bad, max(peak, _rss(query.pid)), named

    codes, bad, peak, named = asyncio.run(scenario())
    print(dict(codes), f"peak RSS {peak / 2**20:.0f} MiB", named)
    assert sum(codes.values()) >= 5_000
    assert bad == []
    assert query.proc is not None
    assert query.proc.poll() is None, query.log()[-3000:]
    assert "Segmentation fault" not in query.log()
    assert peak < RSS_BOUND
    # The chains are refused by name, with the setting to raise; repeat is bounded.
    assert named["chain-3000"] == "INVALID_ARGUMENT"
    assert named["chain-20000"] == "INVALID_ARGUMENT"
    assert named["repeat"] == "RESOURCE_EXHAUSTED"
    assert named["repeat-100m"] == "RESOURCE_EXHAUSTED"
    assert named["lpad"] == named["rpad"] == named["array-resize"] == "RESOURCE_EXHAUSTED"
    assert named["concat-doubling-12"] == named["concat-linear-400"] == "RESOURCE_EXHAUSTED"
    # Nesting that never finished planning is refused before the parser sees it.
    assert {named[label] for label in HANGS} == {"INVALID_ARGUMENT"}
    assert codes[grpc.StatusCode.OK] > 100


#: The replica's memory in the concurrency test: four 32 MiB query pools.
SMALL_MEMORY = 128 * 1024 * 1024
#: 2 million rows sorted whole (about 60 MB of keys and values): past one pool.
HEAVY = (
    "SELECT v, s FROM (SELECT a.id * 10000 + b.id * 50 + c.id AS v, a.s AS s "
    "FROM fuzz.types a, fuzz.types b, (SELECT id FROM fuzz.types WHERE id < 50) c) "
    "ORDER BY s, v DESC"
)


def test_concurrent_memory_heavy_queries_share_the_replicas_memory(tmp_path: Path) -> None:
    env = {
        "LAKE_QUERY_MEMORY_LIMIT_BYTES": str(SMALL_MEMORY),
        "LAKE_QUERY_QUEUE_TIMEOUT_MS": "200",
    }
    cluster = LakeCluster.start(tmp_path, env, meta_env={})
    try:
        query = cluster.query

        async def scenario() -> tuple[list[tuple[grpc.StatusCode, str]], int]:
            async with MetaClient(f"http://{cluster.meta.addr}") as meta:
                await meta.create_table(TableRef("fuzz", "types"), TYPES)
            async with MetaClient(query.url) as client:
                command = protocol.AppendCommand(
                    table=TableRef("fuzz", "types"), operation_id=new_operation_id()
                )
                await client.append(command, TYPES, [_types_batch()])
            options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
            peak = 0
            async with grpc.aio.insecure_channel(query.addr, options=options) as channel:
                stub = flight_grpc.FlightServiceStub(channel)
                running = [asyncio.ensure_future(_run(stub, HEAVY)) for _ in range(8)]
                while not all(task.done() for task in running):
                    peak = max(peak, _rss(query.pid))
                    await asyncio.wait(running, timeout=0.05)
                results = [task.result() for task in running]
                results.append(await _run(stub, "SELECT count(*) FROM fuzz.types"))
            return results, peak

        results, peak = asyncio.run(scenario())
        codes = Counter(code for code, _ in results)
        print(dict(codes), f"peak RSS {peak / 2**20:.0f} MiB")
        # Four pools fit the replica at once: those are served (by spilling, each
        # sorts more than its pool), the rest are refused retryably, never killed.
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert codes[grpc.StatusCode.OK] >= 2
        assert codes[grpc.StatusCode.RESOURCE_EXHAUSTED] >= 1  # eight pools do not fit
        refused = [text for code, text in results if code != grpc.StatusCode.OK]
        assert all("LAKE_QUERY_MEMORY_LIMIT_BYTES" in text for text in refused)
        assert results[-1][0] == grpc.StatusCode.OK
        assert query.proc is not None
        assert query.proc.poll() is None
        assert peak < SMALL_MEMORY + 1024 * 1024 * 1024
    finally:
        cluster.stop()
