"""Statement classification and DataFusion error mapping."""

from __future__ import annotations

import grpc
import pytest

from lake_core.errors import READ_ONLY_MESSAGE, ReadOnlySql, SqlError
from lake_query.planning.sql_errors import leading_keyword, reject_writes, sql_error

WRITES = [
    "INSERT INTO robots.episodes VALUES (1)",
    "insert into robots.missing select 1",
    "UPDATE robots.episodes SET ok = true",
    "DELETE FROM robots.episodes",
    "CREATE TABLE t AS SELECT 1",
    "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/tmp/x'",
    "create view v as select 1",
    "DROP TABLE robots.episodes",
    "COPY (SELECT 1) TO '/tmp/out.csv'",
    "COPY robots.episodes TO '/tmp/out.parquet'",
    "SET datafusion.execution.batch_size = 1",
    "RESET datafusion.execution.batch_size",
    "ALTER TABLE robots.episodes ADD COLUMN x INT",
    "TRUNCATE robots.episodes",
    "MERGE INTO robots.episodes USING robots.rewards ON true WHEN MATCHED THEN DELETE",
    "BEGIN",
    "COMMIT",
    "PREPARE p AS SELECT 1",
    "EXPLAIN INSERT INTO robots.episodes VALUES (1)",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x.csv'",
    "  -- a comment\n /* block */ ( INSERT INTO t VALUES (1))",
]

QUERIES = [
    "SELECT 1",
    "select * from robots.episodes where robot = 'insert'",
    "WITH x AS (SELECT 1) SELECT * FROM x",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "VALUES (1), (2)",
    "EXPLAIN SELECT 1",
    "EXPLAIN ANALYZE SELECT 1",
    "/* set */ select replace('a', 'a', 'b')",
    "DESCRIBE robots.episodes",
]


@pytest.mark.parametrize("sql", WRITES)
def test_writes_are_refused_before_parsing(sql: str) -> None:
    with pytest.raises(ReadOnlySql) as caught:
        reject_writes(sql)
    assert str(caught.value) == READ_ONLY_MESSAGE
    assert caught.value.grpc_status == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("sql", QUERIES)
def test_queries_pass(sql: str) -> None:
    reject_writes(sql)


def test_leading_keyword_looks_through_explain_and_trivia() -> None:
    assert leading_keyword("EXPLAIN ANALYZE VERBOSE select 1") == "SELECT"
    assert leading_keyword("/* x */ -- y\n ((select 1))") == "SELECT"
    assert leading_keyword("") == ""
    assert leading_keyword("explain") == "EXPLAIN"


def test_datafusion_refusals_become_read_only() -> None:
    for message in (
        "Error during planning: DDL not supported: CreateMemoryTable",
        "Error during planning: DML not supported: COPY",
        "Error during planning: Statement not supported: SetVariable",
        "This feature is not implemented: Unsupported SQL statement: BEGIN",
        "This feature is not implemented: Query INSERT INTO t SELECT * FROM x not implemented yet",
    ):
        assert isinstance(sql_error(ValueError(message)), ReadOnlySql)


def test_a_table_name_is_never_read_from_datafusion_text() -> None:
    # A missing table is TableNotFound from what the lazy catalog looked up
    # (test_planning: test_a_missing_table_is_named_from_the_lookup_not_the_message);
    # a message that merely says so is DataFusion's text, passed on as such.
    message = "Error during planning: table 'foo.bar.baz' not found"
    error = sql_error(ValueError(message))
    assert type(error) is SqlError
    assert str(error) == message
    assert error.grpc_status == grpc.StatusCode.INVALID_ARGUMENT


def test_parse_errors_keep_datafusion_message() -> None:
    message = 'SQL error: ParserError("Expected: an SQL statement, found: selec")'
    error = sql_error(Exception(f"DataFusion error: {message}"))
    assert isinstance(error, SqlError)
    assert str(error) == message
