"""Every DataFusion message Lake reads a fact from, produced by the pinned DataFusion.

If an upgrade rewords one of them, a test here fails (not a client's query,
which would silently become a plain SqlError).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext

from lake_core.errors import IntegerOverflow, Internal, QueryTooLarge, ReadOnlySql, SqlError
from lake_query.planning import datafusion_messages as messages
from lake_query.planning import read_only_options
from lake_query.planning.sql_errors import out_of_memory, sql_error

INT64_MIN = -(2**63)


def failure(run: Callable[[], Any]) -> BaseException:
    """What ``run`` raised (it must raise)."""
    try:
        run()
    except Exception as exc:
        return exc
    pytest.fail("expected DataFusion to fail")


@pytest.fixture
def ctx() -> SessionContext:
    ctx = SessionContext()
    ctx.register_record_batches("t", [[pa.record_batch({"a": pa.array([1, 2], pa.int64())})]])
    ctx.register_record_batches("m", [[pa.record_batch({"a": pa.array([INT64_MIN], pa.int64())})]])
    return ctx


def collect(df: Any) -> list[pa.RecordBatch]:
    return list(df.collect())


def stream(df: Any) -> list[pa.RecordBatch]:
    """How the planner reads a running query: Arrow's C stream interface."""
    return list(pa.RecordBatchReader.from_stream(df))


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("CREATE TABLE x AS SELECT 1", "DDL not supported: CreateMemoryTable"),
        ("CREATE VIEW v AS SELECT 1", "DDL not supported: CreateView"),
        ("INSERT INTO t VALUES (1)", "DML not supported: Insert Into"),
        ("DELETE FROM t", "DML not supported: Delete"),
        ("COPY (SELECT 1) TO '{tmp}/out.csv'", "DML not supported: COPY"),
        ("SET datafusion.execution.batch_size = 1", "Statement not supported: SetVariable"),
        ("PREPARE p AS SELECT 1", "Statement not supported: Prepare"),
        ("BEGIN", "Unsupported SQL statement: BEGIN"),
        ("USE robots", "Unsupported SQL statement: USE robots"),
        (
            "WITH x AS (SELECT 1 AS a) INSERT INTO t SELECT * FROM x",
            "Query INSERT INTO t SELECT * FROM x not implemented yet",
        ),
        ("WITH x AS (SELECT 1) UPDATE t SET a = 1", "Query UPDATE t SET a = 1 not implemented"),
        ("WITH x AS (SELECT 1) DELETE FROM t", "Query DELETE FROM t not implemented"),
        (
            "WITH x AS (SELECT 1 AS a) MERGE INTO t USING x ON true WHEN MATCHED THEN DELETE",
            "Query MERGE INTO t USING x",
        ),
    ],
)
def test_refusals_to_plan_a_statement(
    ctx: SessionContext, tmp_path: Path, sql: str, said: str
) -> None:
    sql = sql.format(tmp=tmp_path)
    error = failure(lambda: ctx.sql_with_options(sql, read_only_options()))
    assert type(error) is ValueError
    assert said in str(error)
    assert messages.refused(str(error))
    assert isinstance(sql_error(error), ReadOnlySql)
    assert not list(tmp_path.iterdir())  # refused at planning: nothing ran


def test_a_query_is_not_a_refusal(ctx: SessionContext) -> None:
    error = failure(lambda: ctx.sql_with_options("SELECT nope FROM t", read_only_options()))
    assert not messages.refused(str(error))


@pytest.mark.parametrize("read", [collect, stream])
def test_the_memory_pool_refusing_an_operator(read: Callable[[Any], Any]) -> None:
    small = SessionContext(SessionConfig(), RuntimeEnvBuilder().with_fair_spill_pool(64 * 1024))
    names = pa.array([f"robot-{i}" for i in range(200_000)])
    small.register_record_batches("big", [[pa.record_batch({"b": names})]])
    df = small.sql("SELECT b, count(*) FROM big GROUP BY b ORDER BY b")
    error = failure(lambda: read(df))
    assert "Resources exhausted: Failed to allocate additional" in str(error)
    assert messages.out_of_memory(str(error))
    assert out_of_memory(error)
    assert isinstance(sql_error(error), QueryTooLarge)


@pytest.mark.parametrize("read", [collect, stream])
def test_checked_division_overflowing(ctx: SessionContext, read: Callable[[Any], Any]) -> None:
    error = failure(lambda: read(ctx.sql("SELECT a / -1 FROM m")))
    assert messages.overflowed(str(error)) == f"{INT64_MIN} / -1"
    mapped = sql_error(error)
    assert isinstance(mapped, IntegerOverflow)
    assert str(mapped) == f"integer overflow in {INT64_MIN} / -1"


def test_other_failures_are_none_of_the_facts(ctx: SessionContext) -> None:
    error = failure(lambda: collect(ctx.sql("SELECT CAST('x' AS INT)")))
    text = str(error)
    assert not messages.refused(text)
    assert not messages.out_of_memory(text)
    assert messages.overflowed(text) is None


def test_the_prefix_of_errors_from_running_a_plan(ctx: SessionContext) -> None:
    error = failure(lambda: collect(ctx.sql("SELECT a / -1 FROM m")))
    assert str(error).startswith("DataFusion error: Arrow error: Arithmetic overflow")
    assert messages.without_prefix(str(error)).startswith("Arrow error: Arithmetic overflow")
    twice = f"DataFusion error: {error}"
    assert messages.without_prefix(twice) == messages.without_prefix(str(error))
    # The planner's stream has no prefix; nothing else is taken off.
    plain = str(failure(lambda: stream(ctx.sql("SELECT a / -1 FROM m"))))
    assert messages.without_prefix(plain) == plain


def test_lake_s_own_defects_are_internal_not_the_statement_s() -> None:
    """An IndexError from Lake's code went back as SqlError('list index out of range')."""
    for defect in (IndexError("list index out of range"), KeyError("x"), AttributeError("y")):
        mapped = sql_error(defect)
        assert isinstance(mapped, Internal)
        assert "index" not in str(mapped)
    assert isinstance(sql_error(pa.ArrowInvalid("bad cast")), SqlError)
