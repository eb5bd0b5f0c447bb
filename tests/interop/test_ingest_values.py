"""Values the standard clients send, through appends and bulk ingests, on real processes.

Found by feeding real Metasrv and Query what ADBC, pandas, polars and the SDK
produce: a decimal column holding a null hung the call (Lance panicked on a
misaligned buffer), a null in a NOT NULL column was an internal error that
also failed the other appends of its commit group, and pandas' and polars'
string columns were refused as another type.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
import pytest

import lake_sdk
from lake_core.errors import InvalidAppend
from lake_core.names import TableRef
from tools.lake_testing.data import create_table, describe_version
from tools.lake_testing.plugin import LakeCluster, cluster_env
from tools.lake_testing.waiting import until

DECIMALS = pa.schema([pa.field("id", pa.int64()), pa.field("x", pa.decimal128(38, 10))])
STRICT = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
TEXT = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])


def read(url: str, sql: str) -> pa.Table:
    with flightsql.connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def ingest(url: str, table: TableRef, data: Any) -> int:
    with flightsql.connect(url) as conn, conn.cursor() as cur:
        return int(cur.adbc_ingest(table.name, data, mode="append", db_schema_name=table.namespace))


def decimals(start: int, count: int) -> pa.Table:
    values = [None if i % 7 == 0 else Decimal(i) / 8 for i in range(start, start + count)]
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table([ids, pa.array(values, DECIMALS.field("x").type)], schema=DECIMALS)


def test_decimal_columns_holding_nulls_are_stored(lake_cluster: LakeCluster) -> None:
    table = TableRef("fleet", "decimals")
    create_table(lake_cluster.meta.addr, table, DECIMALS)
    url = lake_cluster.query.url
    # A small batch (read on its own) and a large one (through the stream reader).
    assert ingest(url, table, decimals(0, 2)) == 2
    assert ingest(url, table, decimals(2, 120_000)) == 120_000
    with lake_sdk.Client(url) as client:
        client.append_batches(str(table), decimals(120_002, 9).to_batches())
    got = read(url, "SELECT id, x FROM fleet.decimals ORDER BY id")
    assert got.equals(decimals(0, 120_011).combine_chunks())
    assert describe_version(lake_cluster.meta.addr, table) == 3


@pytest.fixture
def grouping_cluster(tmp_path: Path) -> Iterator[LakeCluster]:
    """Metasrv waits for 2 queued appends before committing a group (a test-only fault
    setting), so two concurrent appends share one group."""
    cluster = LakeCluster.start(
        tmp_path, cluster_env(tmp_path), meta_env={"LAKE_FAULTS": "meta.commit_group_gather=2"}
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_null_in_a_not_null_column_is_refused_alone(grouping_cluster: LakeCluster) -> None:
    table = TableRef("fleet", "strict")
    create_table(grouping_cluster.meta.addr, table, STRICT)
    url = grouping_cluster.query.url
    bad = pa.table([pa.array([1, None], pa.int64()), pa.array(["a", "b"])], schema=STRICT)
    good = pa.table([pa.array([7, 8], pa.int64()), pa.array(["g", "h"])], schema=STRICT)
    outcomes: dict[str, object] = {}

    def append(name: str, data: pa.Table) -> None:
        with lake_sdk.Client(url) as client:
            try:
                outcomes[name] = client.append_batches(str(table), data.to_batches())
            except Exception as exc:
                outcomes[name] = exc

    threads = [
        threading.Thread(target=append, args=pair) for pair in (("bad", bad), ("good", good))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert isinstance(outcomes["bad"], InvalidAppend)
    assert "row 1, column 'id'" in str(outcomes["bad"])
    assert outcomes["good"] == 1
    with pytest.raises(
        adbc_driver_manager.ProgrammingError, match=r"INVALID_ARGUMENT.*column 'id'"
    ):
        ingest(url, table, bad)
    assert describe_version(grouping_cluster.meta.addr, table) == 1
    got = read(url, "SELECT id, s FROM fleet.strict ORDER BY id")
    assert got.to_pydict() == {"id": [7, 8], "s": ["g", "h"]}


def test_pandas_and_polars_string_columns_append_over_adbc(lake_cluster: LakeCluster) -> None:
    import pandas as pd
    import polars as pl

    table = TableRef("fleet", "notes")
    create_table(lake_cluster.meta.addr, table, TEXT)
    url = lake_cluster.query.url
    # pandas asks Query whether the table exists (else it creates it): once it is listed.
    until(lambda: read(url, "SELECT count(*) AS n FROM fleet.notes").num_rows == 1)
    # pandas sends large_string, polars string_view (a categorical: dictionary of them).
    frame = pd.DataFrame({"id": [1, 2, 3], "s": ["pick", "place", None]})
    with flightsql.connect(url) as conn:
        assert frame.to_sql("notes", conn, schema="fleet", if_exists="append", index=False) == 3
    polars_frame = pl.DataFrame({"id": [4, 5], "s": ["stack", "grasp"]})
    categorical = pl.DataFrame({"id": [6, 7], "s": ["pick", "pick"]}).with_columns(
        pl.col("s").cast(pl.Categorical)
    )
    with flightsql.connect(url) as conn:
        for data in (polars_frame, categorical):
            written = data.write_database(
                "fleet.notes", conn, if_table_exists="append", engine="adbc"
            )
            assert written == 2
    got = read(url, "SELECT id, s FROM fleet.notes ORDER BY id")
    expected = ["pick", "place", None, "stack", "grasp", "pick", "pick"]
    assert got.equals(pa.table({"id": list(range(1, 8)), "s": expected}))
    assert describe_version(lake_cluster.meta.addr, table) == 3
    # A value of another type is still refused, and nothing is committed.
    with pytest.raises(adbc_driver_manager.ProgrammingError, match="does not match"):
        ingest(url, table, pa.table({"id": [9], "s": [1.5]}))
    assert describe_version(lake_cluster.meta.addr, table) == 3
