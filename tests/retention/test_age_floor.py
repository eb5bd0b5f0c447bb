"""Retention by age as well as count, through real ``lake meta`` and ``lake query`` processes.

With ``LAKE_LANCE_RETAIN_VERSIONS=2`` a version is reclaimed only once it is
outside BOTH the two newest versions and the age floor
(``LAKE_LANCE_RETAIN_MIN_AGE_SECS``, counted from when a newer version
replaced it): a ticket planned before many appends still reads while its
version is younger than the floor; past the floor it fails
FAILED_PRECONDITION (VersionReclaimed); a tagged version survives both.
"""

from __future__ import annotations

import time
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.config import (
    COMPACTION,
    LANCE_RETAIN_MIN_AGE_SECS,
    LANCE_RETAIN_VERSIONS,
)
from lake_core.proto import flight_sql_pb2
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys
from tools.lake_testing.waiting import until

ROWS = 5
SQL = "SELECT * FROM lake.robots.episodes"


def cluster(root: Path, min_age_secs: int) -> LakeCluster:
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        COMPACTION: "off",
        LANCE_RETAIN_VERSIONS: "2",
        LANCE_RETAIN_MIN_AGE_SECS: str(min_age_secs),
    }
    return LakeCluster.start(root, env)


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def rows_of(appends: int) -> int:
    return ROWS * appends


def dataset_path(running: LakeCluster) -> str:
    return str(running.root / "data" / "tables" / "robots" / "episodes.lance")


def test_old_tickets_read_while_younger_than_the_age_floor(tmp_path: Path) -> None:
    running = cluster(tmp_path, min_age_secs=600)
    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with (
            lake_sdk.Client(running.query.url) as sdk,
            flight.FlightClient(f"grpc+tcp://{running.query.addr}") as client,
        ):
            sdk.append_batches(EPISODES, [episodes(0, ROWS)])
            info = client.get_flight_info(statement(SQL))
            for i in range(1, 13):
                sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])
            # Far outside the count window of 2, well inside the age floor.
            pinned = client.do_get(info.endpoints[0].ticket).read_all()
            assert pinned.num_rows == rows_of(1)
            now = client.do_get(client.get_flight_info(statement(SQL)).endpoints[0].ticket)
            assert now.read_all().num_rows == rows_of(13)
        # Nothing was reclaimed: create + 13 appends, every Lance version there.
        assert len(lance.dataset(dataset_path(running)).versions()) == 14
    finally:
        running.stop()


def test_versions_outside_both_windows_fail_and_tagged_ones_survive(tmp_path: Path) -> None:
    floor = 2
    running = cluster(tmp_path, min_age_secs=floor)
    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with (
            lake_sdk.Client(running.query.url) as sdk,
            flight.FlightClient(f"grpc+tcp://{running.query.addr}") as client,
        ):
            sdk.append_batches(EPISODES, [episodes(0, ROWS)])
            reclaimed = client.get_flight_info(statement(SQL))  # Lake v1
            sdk.append_batches(EPISODES, [episodes(ROWS, ROWS)])
            tagged = client.get_flight_info(statement(SQL))  # Lake v2, tagged below
            head = lance.dataset(dataset_path(running))
            head.tags.create("keep", head.latest_version)
            sdk.append_batches(EPISODES, [episodes(2 * ROWS, ROWS)])
            replaced_late = client.get_flight_info(statement(SQL))  # Lake v3
            stamp = lance.dataset(dataset_path(running)).get_version()["timestamp"].timestamp()
            # v1 and v2 were replaced more than the floor ago once this holds;
            # v3 is replaced only by the appends below, so it stays young.
            until(lambda: time.time() > stamp + floor + 0.2)
            for i in range(3, 6):
                sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])
            # pyarrow reports FAILED_PRECONDITION as ArrowInvalid, with the status named.
            with pytest.raises(pa.ArrowInvalid, match=r"precondition failed.*no longer available"):
                client.do_get(reclaimed.endpoints[0].ticket).read_all()
            with pytest.raises(lake_sdk.VersionReclaimed):
                sdk.query_table(SQL, as_of=1)
            assert client.do_get(tagged.endpoints[0].ticket).read_all().num_rows == rows_of(2)
            late = client.do_get(replaced_late.endpoints[0].ticket).read_all()
            assert late.num_rows == rows_of(3)
            # v1 is gone; the tagged v2 and v3 (replaced under the floor ago) remain.
            assert sdk.versions(EPISODES).column("version").to_pylist() == [2, 3, 4, 5, 6]
    finally:
        running.stop()
