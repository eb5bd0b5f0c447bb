"""ADBC's incremental execution (PollFlightInfo) against durable async queries."""

from __future__ import annotations

from collections.abc import Callable

import adbc_driver_flightsql.dbapi as flightsql
import pyarrow as pa

from tests.async_queries.conftest import SQL, TOKENS, AsyncLake, client
from tests.async_queries.test_lifecycle import FAST_LEASE


def test_adbc_incremental_execution_returns_the_full_result(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    replica = async_lake.add_query(FAST_LEASE)  # 64 KiB parts: several partitions
    loaded(3000)
    with client(replica) as sdk:
        expected = sdk.query_table(SQL)
    kwargs = {"adbc.flight.sql.authorization_header": f"Bearer {TOKENS['acme']}"}
    with flightsql.connect(replica.url, db_kwargs=kwargs) as conn, conn.cursor() as cur:
        cur.adbc_statement.set_options(**{"adbc.statement.exec.incremental": "true"})
        partitions: list[bytes] = []
        schema = None
        # Each call returns the partitions that are new since the last one (the driver
        # polls until there are some); an empty answer means the query is complete.
        for _ in range(100):
            found, found_schema = cur.adbc_execute_partitions(SQL)
            if not found:
                break
            schema = found_schema
            partitions += found
        tables = []
        for partition in partitions:
            cur.adbc_read_partition(partition)
            tables.append(cur.fetch_arrow_table())
    assert len(partitions) >= 2
    got = pa.concat_tables(tables)
    assert schema is not None
    assert got.schema.equals(expected.schema)
    assert got.equals(expected)
