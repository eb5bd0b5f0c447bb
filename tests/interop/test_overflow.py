"""Integer overflow reaches real clients typed: ADBC, pyarrow Flight and the SDK
against a real ``lake query`` process (issue 36 item 3)."""

from __future__ import annotations

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import lake_sdk
from lake_core.errors import IntegerOverflow
from lake_core.proto import flight_sql_pb2
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import LakeCluster

from .test_pyarrow_flight import command, redeem

ROWS = 1_000  # steps 0..999: each steps * 10**14 fits in BIGINT, their sum (4.995e19) does not
SUM = "SELECT sum(steps * 100000000000000) AS s FROM robots.episodes"
ADD = "SELECT 9223372036854775807 + 1 AS x"
IN_RANGE = "SELECT sum(steps * 1000) AS s, max(steps) - 1 AS m FROM robots.episodes"


@pytest.fixture
def loaded(lake_cluster: LakeCluster) -> LakeCluster:
    create_table(lake_cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    with lake_sdk.Client(lake_cluster.query.url) as client:
        client.append_batches(EPISODES, [episodes(0, ROWS)])
    return lake_cluster


def test_overflow_through_adbc_pyarrow_and_the_sdk(loaded: LakeCluster) -> None:
    with flightsql.connect(loaded.query.url) as conn, conn.cursor() as cur:
        for sql, operation in ((SUM, "sum (int64)"), (ADD, "addition (int64)")):
            cur.execute(sql)  # plans it (GetFlightInfo); running it (DoGet) fails
            with pytest.raises(adbc_driver_manager.ProgrammingError) as raised:
                cur.fetch_arrow_table()
            assert raised.value.status_code == adbc_driver_manager.AdbcStatusCode.INVALID_ARGUMENT
            assert f"integer overflow in {operation}" in str(raised.value)
        cur.execute(IN_RANGE)
        assert cur.fetch_arrow_table().to_pylist() == [
            {"s": 1000 * ROWS * (ROWS - 1) // 2, "m": ROWS - 2}
        ]

    with flight.FlightClient(f"grpc+tcp://{loaded.query.addr}") as client:
        descriptor = command(flight_sql_pb2.CommandStatementQuery(query=SUM))
        info = client.get_flight_info(descriptor)  # planning succeeds; running fails
        with pytest.raises(pa.ArrowInvalid, match=r"integer overflow in sum \(int64\)"):
            redeem(client, info.endpoints[0]).read_all()

    with lake_sdk.Client(loaded.query.url) as sdk:
        with pytest.raises(IntegerOverflow, match=r"integer overflow in sum \(int64\)"):
            sdk.query_table(SUM)
        with pytest.raises(IntegerOverflow, match=r"integer overflow in addition \(int64\)"):
            sdk.query_table(ADD)
