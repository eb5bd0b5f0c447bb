"""Statement bounds, bounded built-ins, memory pools and client-error classification."""

from __future__ import annotations

import grpc
import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from lake_core.errors import InvalidArgument, ResourceExhausted
from lake_core.principal import DEV_PRINCIPAL
from lake_core.proto import flight_grpc
from lake_core.proto import flight_pb2 as pb
from lake_core.proto import flight_sql_pb2 as sql_pb
from lake_query.config import QueryConfig
from lake_query.planning import Planner, QueryLimits, QuerySpec
from lake_query.planning.limits import sql_shape

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
