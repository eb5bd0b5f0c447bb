"""A statement that splits into partitions interactively runs whole as an async job."""

from __future__ import annotations

from collections.abc import Callable

from tests.async_queries.conftest import AsyncLake, client


def test_a_partitioned_scan_runs_whole_as_a_job(
    async_lake: AsyncLake, loaded: Callable[[int], None]
) -> None:
    # Small partitions: five appends of 1,000 rows split into several endpoints.
    replica = async_lake.add_query(env={"LAKE_QUERY_MIN_ENDPOINT_ROWS": "1000"})
    loaded(5_000)
    sql = "SELECT episode_id, steps FROM robots.episodes"
    with client(replica) as sdk:
        assert sdk.scan(sql, shard=(1, 2)).to_table().num_rows > 0  # it does split
        interactive = sdk.query_table(sql)
        job = sdk.jobs.query(sql).to_table()
    assert interactive.num_rows == job.num_rows == 5_000
    assert sorted(job.column("episode_id").to_pylist()) == sorted(
        interactive.column("episode_id").to_pylist()
    )
