"""Statement bounds, bounded built-ins, memory pools and client-error classification."""

from __future__ import annotations

import grpc
import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from lake_core.errors import (
    WANTS_CODES,
    InvalidArgument,
    QueryTooLarge,
    ResourceExhausted,
    SqlError,
)
from lake_core.principal import DEV_PRINCIPAL
from lake_core.proto import flight_grpc
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_query.config import QueryConfig
from lake_query.planning import Planner, QueryLimits, QuerySpec
from lake_query.planning.limits import sql_shape
from lake_query.planning.sql_errors import sql_error

from .conftest import LocalCatalog, RunningQuery


@pytest.fixture
def planner(catalog: LocalCatalog) -> Planner:
    return Planner(catalog.resolve, catalog.refs)


def rows(planner: Planner, sql: str, params: pa.RecordBatch | None = None) -> pa.Table:
    planned = planner.plan(sql, DEV_PRINCIPAL, params)
    stream = planner.execute(planned.spec, DEV_PRINCIPAL)
    return pa.Table.from_batches(list(stream), schema=stream.schema)


def test_the_token_scan_skips_literals_comments_and_quoted_names() -> None:
    shape = sql_shape("SELECT a + b, 'x + y -- $9' FROM \"t+s\" /* 1 + 1 */ WHERE c = $2 -- + $7")
    assert (shape.operators, shape.selects, shape.max_placeholder) == (2, 1, 2)


@pytest.mark.parametrize("terms", [3_000, 20_000])
def test_long_operator_chains_are_refused_before_planning(planner: Planner, terms: int) -> None:
    with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_EXPRESSION_TERMS"):
        planner.plan("SELECT " + "+".join(["1"] * terms), DEV_PRINCIPAL)


def test_a_chain_under_the_limit_runs(planner: Planner) -> None:
    assert rows(planner, "SELECT " + "+".join(["1"] * 400) + " AS n").column("n")[0].as_py() == 400


def test_deep_plans_are_refused_before_execution(planner: Planner) -> None:
    ctes = ", ".join(f"c{i} AS (SELECT episode_id FROM c{i - 1})" for i in range(1, 60))
    sql = f"WITH c0 AS (SELECT episode_id FROM robots.episodes), {ctes} SELECT * FROM c59"
    with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_PLAN_DEPTH"):
        planner.plan(sql, DEV_PRINCIPAL)
    with pytest.raises(InvalidArgument, match="LAKE_QUERY_MAX_QUERY_BLOCKS"):
        Planner(lambda _: None, limits=QueryLimits(max_query_blocks=3)).plan(
            "SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4", DEV_PRINCIPAL
        )


def test_an_unbound_parameter_is_the_clients_error(planner: Planner) -> None:
    with pytest.raises(InvalidArgument, match=r"\$1 has no bound value"):
        planner.plan("SELECT episode_id FROM robots.episodes WHERE episode_id = $1", DEV_PRINCIPAL)
    # A statement being prepared binds later; running it unbound is refused then.
    spec = QuerySpec(sql="SELECT $1 + 1 AS n")
    prepared = planner.plan_spec(spec, DEV_PRINCIPAL, prepare=True)
    with pytest.raises(InvalidArgument, match=r"\$1 has no bound value"):
        planner.execute(prepared.spec, DEV_PRINCIPAL)
    bound = pa.record_batch([pa.array([41], pa.int64())], names=["p"])
    assert rows(planner, "SELECT $1 + 1 AS n", bound).column("n")[0].as_py() == 42


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("SELECT $99999999999", r"\$99999999999 has no"),
        ("SELECT $2, $1234567890123", r"\$1234567890123 has no"),
        ("SELECT $0001", r"\$0001 has no"),
        ("SELECT $" + "9" * 5000, r"\$9999999999999999999\.\.\.99999999 \(5000 digits\) has no"),
    ],
)
def test_an_unbound_parameter_is_named_as_written(planner: Planner, sql: str, named: str) -> None:
    with pytest.raises(InvalidArgument, match=named):
        planner.plan(sql, DEV_PRINCIPAL)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT length(repeat('x', 1500000000))",
        "SELECT length(repeat(repeat('x', 1000000), 1000))",
        "SELECT array_repeat(1, 1000000000)",
        "SELECT range(0, 1000000000)",
        "SELECT generate_series(1, 1000000000)",
    ],
)
def test_size_amplifying_functions_are_bounded(planner: Planner, sql: str) -> None:
    with pytest.raises(ResourceExhausted, match="LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES"):
        rows(planner, sql)


def test_bounded_functions_keep_their_answers(planner: Planner) -> None:
    got = rows(
        planner,
        "SELECT repeat('ab', 3) AS r, repeat('x', -1) AS e, array_repeat(7, 2) AS a, "
        "range(1, 4) AS g, generate_series(1, 3) AS s",
    ).to_pylist()
    assert got == [{"r": "ababab", "e": "", "a": [7, 7], "g": [1, 2, 3], "s": [1, 2, 3]}]


def test_a_query_past_its_memory_share_spills_or_is_resource_exhausted(
    catalog: LocalCatalog,
) -> None:
    small = Planner(catalog.resolve, catalog.refs, limits=QueryLimits(query_memory_bytes=1 << 20))
    # A hash join's build side cannot spill: past the pool it is refused.
    join = (
        "SELECT a.robot, count(*) AS n FROM robots.episodes a JOIN robots.episodes b "
        "ON a.robot = b.robot GROUP BY a.robot ORDER BY a.robot"
    )
    with pytest.raises(ResourceExhausted, match="LAKE_QUERY_MEMORY_LIMIT_BYTES"):
        rows(small, join)
    # The replica keeps serving.
    assert rows(small, "SELECT count(*) AS n FROM robots.episodes").column("n")[0].as_py() == 20_000


def test_limits_come_from_the_environment() -> None:
    config = QueryConfig.load(
        env={
            "LAKE_QUERY_MEMORY_LIMIT_BYTES": str(1 << 30),
            "LAKE_QUERY_MAX_EXPRESSION_TERMS": "100",
            "LAKE_QUERY_MAX_PLAN_DEPTH": "50",
        }
    )
    assert config.limits.query_memory_bytes == (1 << 30) // 4
    assert config.limits.max_expression_terms == 100
    assert config.limits.max_plan_depth == 50


def test_sql_that_is_not_utf8_is_invalid_argument(query_server: RunningQuery) -> None:
    body = b"\x0a\x04\xff\xfe\x00S"  # CommandStatementQuery.query = 4 bytes, not UTF-8
    wrapper = any_pb2.Any(
        type_url="type.googleapis.com/" + sql_pb.CommandStatementQuery.DESCRIPTOR.full_name,
        value=body,
    )
    descriptor = pb.FlightDescriptor(type=pb.FlightDescriptor.CMD, cmd=wrapper.SerializeToString())
    with grpc.insecure_channel(query_server.addr) as channel:
        stub = flight_grpc.FlightServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetFlightInfo(descriptor, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT length(lpad('x', 1500000000))",
        "SELECT length(rpad('x', 100000000, 'ab'))",
        "SELECT lpad(robot, episode_id) FROM robots.episodes",
        "SELECT \"rpad\" /* a comment */ ('x', 2049)",
        "SELECT cardinality(array_resize(make_array(1), 1000000000, 0))",
    ],
)
def test_padding_and_resizing_need_a_small_literal_size(planner: Planner, sql: str) -> None:
    with pytest.raises(QueryTooLarge, match="LAKE_QUERY_MAX_FUNCTION_OUTPUT_BYTES") as refused:
        planner.plan(sql, DEV_PRINCIPAL)
    assert refused.value.retryable is False


def test_padding_and_resizing_keep_their_answers(planner: Planner) -> None:
    got = rows(
        planner,
        "SELECT lpad('a', 3) AS l, rpad('a', 4, 'xy') AS r, lpad('abc', -1) AS e, "
        "array_resize(make_array(1), 3, 0) AS z, length(lpad('x', 2048)) AS n",
    ).to_pylist()
    assert got == [{"l": "  a", "r": "axyx", "e": "", "z": [1, 0, 0], "n": 2048}]


def test_a_refused_query_is_not_retryable_and_the_replica_keeps_serving(
    query_server: RunningQuery,
) -> None:
    def info(sql: str) -> tuple[grpc.StatusCode, dict[str, str]]:
        command = any_pb2.Any()
        command.Pack(sql_pb.CommandStatementQuery(query=sql))
        descriptor = pb.FlightDescriptor(
            type=pb.FlightDescriptor.CMD, cmd=command.SerializeToString()
        )
        with grpc.insecure_channel(query_server.addr) as channel:
            stub = flight_grpc.FlightServiceStub(channel)
            try:
                stub.GetFlightInfo(descriptor, timeout=30, metadata=(WANTS_CODES,))
            except grpc.RpcError as exc:
                return exc.code(), dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
        return grpc.StatusCode.OK, {}

    code, trailers = info("SELECT lpad('x', 1500000000)")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert trailers == {"lake-error-code": "QueryTooLarge", "lake-retryable": "false"}
    code, trailers = info("SELECT length(repeat('x', 1500000000))")
    assert code == grpc.StatusCode.OK  # refused when it runs (DoGet), like every batch bound
    assert info("SELECT count(*) FROM robots.episodes")[0] == grpc.StatusCode.OK


def test_sorts_and_aggregates_larger_than_the_pool_spill(catalog: LocalCatalog) -> None:
    small = Planner(catalog.resolve, catalog.refs, limits=QueryLimits(query_memory_bytes=32 << 20))
    # 4 million int64 (32 MB of values, more in sort keys) sorted whole, and
    # 1 million groups, in a 32 MiB pool.
    product = (
        "SELECT a.episode_id * 200 + b.episode_id AS v FROM robots.episodes a "
        "CROSS JOIN (SELECT episode_id FROM robots.episodes WHERE episode_id < 200) b"
    )
    ordered = rows(small, f"SELECT v FROM ({product}) ORDER BY v DESC")
    assert ordered.num_rows == 4_000_000
    assert ordered.column("v")[0].as_py() == 3_999_999
    grouped = rows(
        small,
        f"SELECT count(*) AS groups FROM (SELECT v % 1000000 AS k, count(*) AS n "
        f"FROM ({product}) GROUP BY k)",
    )
    assert grouped.column("groups")[0].as_py() == 1_000_000


def test_the_replicas_memory_bounds_all_its_queries_together(catalog: LocalCatalog) -> None:
    # Two queries may run at once (admission's slots): each gets a full 32 MiB pool.
    limits = QueryLimits(
        memory_limit_bytes=64 << 20,
        query_memory_bytes=32 << 20,
        memory_wait_ms=50,
        memory_slots=2,
        memory_slots_per_tenant=2,
    )
    planner = Planner(catalog.resolve, catalog.refs, limits=limits)
    sql = "SELECT robot, count(*) AS n FROM robots.episodes GROUP BY robot"
    specs = [planner.plan(sql, DEV_PRINCIPAL).spec for _ in range(3)]
    first = planner.execute(specs[0], DEV_PRINCIPAL)
    second = planner.execute(specs[1], DEV_PRINCIPAL)
    assert planner.memory.reserved == 64 << 20
    # A third (more than admission lets in, as durable jobs may be) would take the
    # replica past its limit: refused after the wait, and retryable (it is the
    # replica's load, not the query's size).
    with pytest.raises(ResourceExhausted, match="LAKE_QUERY_MEMORY_LIMIT_BYTES") as busy:
        planner.execute(specs[2], DEV_PRINCIPAL)
    assert not isinstance(busy.value, QueryTooLarge)
    assert busy.value.retryable is True
    assert sum(b.num_rows for b in first) > 0  # exhausted: its share is back
    second.close()
    assert planner.memory.reserved == 0
    third = planner.execute(specs[2], DEV_PRINCIPAL)
    assert sum(b.num_rows for b in third) > 0
    # A direct scan runs no DataFusion operator and holds nothing.
    direct = planner.execute(
        planner.plan("SELECT * FROM robots.episodes WHERE episode_id < 5", DEV_PRINCIPAL).spec,
        DEV_PRINCIPAL,
    )
    assert planner.memory.reserved == 0
    assert sum(b.num_rows for b in direct) == 5


#: One aggregate over every row (no group to spill): needs its values in memory at once.
WHOLE_AGGREGATE = (
    "SELECT cardinality(array_agg(a.robot)) AS n "
    "FROM robots.episodes a CROSS JOIN (SELECT episode_id FROM robots.episodes "
    "WHERE episode_id < 20) b"
)


def test_a_busy_replica_shrinks_pools_instead_of_refusing(catalog: LocalCatalog) -> None:
    # The default 64 slots: a query admitted while another holds the memory
    # gets a smaller pool at once; one that needs more than that is told to
    # retry (the replica was busy), where an idle replica runs it.
    limits = QueryLimits(memory_limit_bytes=64 << 20, query_memory_bytes=32 << 20)
    planner = Planner(catalog.resolve, catalog.refs, limits=limits)
    sql = "SELECT robot, count(*) AS n FROM robots.episodes GROUP BY robot"
    held = planner.execute(planner.plan(sql, DEV_PRINCIPAL).spec, DEV_PRINCIPAL)
    assert planner.memory.reserved == 32 << 20
    small = planner.execute(planner.plan(sql, DEV_PRINCIPAL).spec, DEV_PRINCIPAL)
    assert planner.memory.reserved < 64 << 20  # a pool, smaller than the full one
    assert sum(b.num_rows for b in small) > 0
    big = planner.plan(WHOLE_AGGREGATE, DEV_PRINCIPAL).spec
    with pytest.raises(ResourceExhausted, match="busy") as busy:
        sum(b.num_rows for b in planner.execute(big, DEV_PRINCIPAL))
    assert not isinstance(busy.value, QueryTooLarge)
    assert busy.value.retryable is True
    held.close()
    assert planner.memory.reserved == 0
    idle = rows(planner, WHOLE_AGGREGATE)
    assert idle.column("n")[0].as_py() == 400_000


@pytest.mark.parametrize(
    "raw",
    [
        "External error: thread 'tokio-rt-worker' panicked at /root/.cargo/registry/src/"
        "index.crates.io-6f17d22bba15001f/lance-file-0.20.0/src/reader.rs:123:45:\n"
        "index out of bounds: the len is 3 but the index is 7",
        "External error: LanceError(IO): Not found: /srv/lake/data/robots/episodes.lance/"
        "data/0f1e.lance, rust/lance/src/dataset/scanner.rs:1187:31",
        "Object Store error: Generic S3 error: s3://bucket/tenant/t.lance/_versions/3.manifest",
        "External error: Execution error: file:///var/lake/t.lance/data/x.lance is truncated",
    ],
)
def test_engine_internals_never_reach_the_client(raw: str) -> None:
    error = sql_error(Exception(f"DataFusion error: {raw}"))
    assert isinstance(error, SqlError)
    message = str(error)
    for leaked in ("/root/.cargo", ".rs:", "panicked", "://", "/srv/", "/var/", "bucket"):
        assert leaked not in message
    assert message.startswith(raw.split(":")[0])  # the human part stays
