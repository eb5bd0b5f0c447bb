"""Repeated scans from memory (issue 33, item 2) on a real ``lake query`` process.

One replica with its native data plane (``LAKE_QUERY_DATA_ADDR``), principals
and metrics, and a small scan cache (``LAKE_QUERY_SCAN_CACHE_BYTES`` = 24 MiB):

- a repeated DoGet of one ticket is served from the cache on both DoGet
  paths (the data plane and the grpcio listener), rows unchanged, and the
  hit counter rises;
- another version, projection, filter or partition is another entry;
- kept scans are evicted by size and the cache never holds more than its
  bound; a scan larger than the cache streams whole and is not kept;
- a client that stops mid-stream leaves no partial entry behind;
- a caller without access is refused exactly as before, however warm the
  cache; another tenant granted the table shares its kept scans;
- ``0`` turns the cache off.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from google.protobuf import any_pb2

import lake_sdk
from lake_core.config import (
    AUTH_PRINCIPALS_FILE,
    METRICS_ADDR,
    QUERY_DATA_ADDR,
    QUERY_SCAN_CACHE_BYTES,
)
from lake_core.names import TableRef
from lake_core.proto import flight_sql_pb2 as sql_pb
from tests.telemetry.scrape import scrape, value
from tools.lake_testing.data import create_table
from tools.lake_testing.dataplane import NEVER_READING
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import LakeProcess, free_port, start_meta, start_query
from tools.lake_testing.waiting import until

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
CACHE_BYTES = 24 * MIB
TOKENS = {"alice": "lk_scan_alice_001", "amy": "lk_scan_amy_0001", "bob": "lk_scan_bob_0001"}
GRANTS = {
    "alice": ("acme", ["robots"]),
    "amy": ("initech", ["robots"]),  # another tenant granted the same namespace
    "bob": ("globex", ["globex"]),  # no grant on robots
}
NUMBERS = pa.schema([("id", pa.int64()), ("x", pa.float64())])
WIDE = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("y", pa.float64()), ("z", pa.int64())])
SMALL = TableRef("robots", "small")  # 100,000 rows of NUMBERS: 1.6 MB
MEDIUM = TableRef("robots", "medium")  # 600,000 rows of WIDE: 19.2 MB, six 3.7 MB batches
GROWING = TableRef("robots", "growing")  # NUMBERS, appended to by a test
PAYLOADS = TableRef("robots", "payloads")  # 30 MB of strings: larger than the cache
PAYLOAD_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.utf8())])


def numbers(start: int, rows: int) -> pa.Table:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table([pa.array(ids), pa.array(ids * 0.25)], schema=NUMBERS)


def wide(rows: int) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        [pa.array(ids), pa.array(ids * 0.5), pa.array(ids * 2.0), pa.array(ids % 7)], schema=WIDE
    )


def payloads(rows: int) -> pa.Table:
    ids = list(range(rows))
    return pa.table(
        {"id": ids, "payload": ["p" * 1_000 + f"{i:08d}" for i in ids]}, schema=PAYLOAD_SCHEMA
    )


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(sql_pb.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def options(who: str) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(
        headers=[(b"authorization", f"Bearer {TOKENS[who]}".encode())], timeout=60
    )


@dataclass
class Replica:
    process: LakeProcess
    metrics: int
    clients: dict[str, flight.FlightClient]

    def client(self, where: str) -> flight.FlightClient:
        """``main``: the grpcio listener; ``data``: the native data plane."""
        if where not in self.clients:
            uri = (
                f"grpc+tcp://{self.process.env[QUERY_DATA_ADDR]}"
                if where == "data"
                else f"grpc+tcp://{self.process.addr}"
            )
            self.clients[where] = flight.FlightClient(uri)
        return self.clients[where]

    def plan(self, sql: str, who: str = "alice") -> list[flight.Ticket]:
        info = self.client("main").get_flight_info(statement(sql), options(who))
        for endpoint in info.endpoints:
            if QUERY_DATA_ADDR in self.process.env:
                (location,) = endpoint.locations
                assert location.uri.decode() == f"grpc+tcp://{self.process.env[QUERY_DATA_ADDR]}"
        return [endpoint.ticket for endpoint in info.endpoints]

    def read(self, tickets: list[flight.Ticket], where: str, who: str = "alice") -> pa.Table:
        tables = [self.client(where).do_get(t, options(who)).read_all() for t in tickets]
        return pa.concat_tables(tables)

    def sample(self, name: str, **labels: str) -> float:
        return value(scrape(self.metrics), name, **labels)

    def lookups(self) -> tuple[float, float]:
        text = scrape(self.metrics)
        return (
            value(text, "lake_query_scan_cache_lookups_total", result="hit"),
            value(text, "lake_query_scan_cache_lookups_total", result="miss"),
        )

    def held(self) -> float:
        return self.sample("lake_query_scan_cache_bytes")


def _principals(path: Path) -> Path:
    bindings = [
        {
            "token": TOKENS[who],
            "principal_id": f"{who}-user",
            "tenant_id": tenant,
            "role": "user",
            "namespaces": namespaces,
        }
        for who, (tenant, namespaces) in GRANTS.items()
    ]
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(0o600)
    return path


@dataclass
class Lake:
    meta: LakeProcess
    root: Path
    env: dict[str, str]
    replica: Replica

    def start_replica(self, extra: dict[str, str]) -> Replica:
        metrics = free_port()
        env = {**self.env, METRICS_ADDR: f"127.0.0.1:{metrics}", **extra}
        process = start_query(self.meta.addr, self.root, env=env, probe_token=TOKENS["alice"])
        return Replica(process, metrics, {})


def stop(replica: Replica) -> None:
    for client in replica.clients.values():
        client.close()
    replica.process.stop()


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp("scancache")
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        AUTH_PRINCIPALS_FILE: str(_principals(root / "principals.json")),
        "LAKE_COMPACTION": "off",
    }
    meta = start_meta(root / "data", root)
    try:
        create_table(meta.addr, SMALL, NUMBERS)
        create_table(meta.addr, MEDIUM, WIDE)
        create_table(meta.addr, GROWING, NUMBERS)
        create_table(meta.addr, PAYLOADS, PAYLOAD_SCHEMA)
        lake = Lake(meta, root, env, None)  # type: ignore[arg-type]
        lake.replica = lake.start_replica(
            {
                QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}",
                QUERY_SCAN_CACHE_BYTES: str(CACHE_BYTES),
            }
        )
        try:
            with lake_sdk.Client(lake.replica.process.url, token=TOKENS["alice"]) as client:
                client.ingest(SMALL, numbers(0, 100_000))
                client.ingest(MEDIUM, wide(600_000))
                client.ingest(GROWING, numbers(0, 300_000))
                client.ingest(PAYLOADS, payloads(30_000))
            yield lake
        finally:
            stop(lake.replica)
    finally:
        meta.stop()


@pytest.fixture
def replica(lake: Lake) -> Replica:
    return lake.replica


def test_a_repeated_doget_is_served_from_the_cache_on_both_paths(replica: Replica) -> None:
    sql = f"SELECT * FROM {SMALL.qualified}"
    tickets = replica.plan(sql)
    assert len(tickets) == 1
    hits, misses = replica.lookups()
    admitted = replica.sample("lake_query_scan_cache_fills_total", outcome="admitted")
    first = replica.read(tickets, "data")
    assert first.sort_by("id").equals(numbers(0, 100_000))
    assert replica.lookups() == (hits, misses + 1)
    assert replica.sample("lake_query_scan_cache_fills_total", outcome="admitted") == admitted + 1
    assert replica.held() >= 100_000 * 16

    for where in ("data", "main", "data"):
        again = replica.read(tickets, where)
        assert again.equals(first), where
    assert replica.lookups() == (hits + 3, misses + 1)
    # A new ticket for the same statement pins the same version: the same kept scan.
    assert replica.read(replica.plan(sql), "main").equals(first)
    assert replica.lookups() == (hits + 4, misses + 1)


def test_version_projection_filter_and_partition_are_other_entries(replica: Replica) -> None:
    whole = replica.plan(f"SELECT * FROM {MEDIUM.qualified}")
    before = replica.read(whole, "data")
    assert before.sort_by("id").equals(wide(600_000))
    variants = {
        f"SELECT id FROM {MEDIUM.qualified}": before.select(["id"]),
        f"SELECT x, id FROM {MEDIUM.qualified}": before.select(["x", "id"]),
        f"SELECT * FROM {MEDIUM.qualified} WHERE id < 1000": before.filter(
            pa.compute.less(before["id"], 1000)
        ),
    }
    for sql, expected in variants.items():
        tickets = replica.plan(sql)
        hits, misses = replica.lookups()
        got = replica.read(tickets, "data")
        assert replica.lookups() == (hits, misses + 1), sql
        assert got.sort_by("id").equals(expected.sort_by("id")), sql
        assert replica.read(tickets, "main").equals(got)
        assert replica.lookups() == (hits + 1, misses + 1), sql

    # A new version is another entry; a ticket of the old one still reads the old rows.
    sql = f"SELECT * FROM {GROWING.qualified}"
    old = replica.plan(sql)
    older = replica.read(old, "data")
    assert older.num_rows == 300_000
    with lake_sdk.Client(replica.process.url, token=TOKENS["alice"]) as client:
        client.ingest(GROWING, numbers(300_000, 300_000))
    until(lambda: len(replica.plan(sql)) == 2)
    # Two fragments of 300,000 rows each: two partitions, each its own entry.
    parts = replica.plan(sql)
    hits, misses = replica.lookups()
    newer = replica.read(parts, "data")
    assert newer.sort_by("id").equals(numbers(0, 600_000))
    assert replica.lookups() == (hits, misses + 2)
    assert replica.read(parts[1:], "main").equals(replica.read(parts[1:], "data"))
    assert replica.lookups() == (hits + 2, misses + 2)
    assert replica.read(old, "data").equals(older)
    assert replica.lookups() == (hits + 3, misses + 2)


def test_kept_scans_are_evicted_by_size_and_an_oversize_scan_is_not_kept(
    replica: Replica,
) -> None:
    evictions = replica.sample("lake_query_scan_cache_evictions_total")
    filled = [replica.plan(f"SELECT * FROM {SMALL.qualified} WHERE id >= {n}") for n in range(4)]
    for tickets in filled:  # each ~1.6 MB
        replica.read(tickets, "data")
    # Then 4.8 MB and 19.2 MB: the three together pass 24 MiB, whatever else is kept.
    for sql in (
        f"SELECT x FROM {MEDIUM.qualified} WHERE id < 600000",
        f"SELECT * FROM {MEDIUM.qualified} WHERE id < 600000",
    ):
        replica.read(replica.plan(sql), "data")
        assert replica.held() <= CACHE_BYTES
    assert replica.sample("lake_query_scan_cache_evictions_total") > evictions
    hits, misses = replica.lookups()
    replica.read(filled[0], "data")  # the least recently used one went
    assert replica.lookups() == (hits, misses + 1)

    too_large = replica.sample("lake_query_scan_cache_fills_total", outcome="too_large")
    tickets = replica.plan(f"SELECT * FROM {PAYLOADS.qualified}")
    for where in ("data", "main"):
        hits, misses = replica.lookups()
        got = replica.read(tickets, where)
        assert got.num_rows == 30_000
        assert got.sort_by("id").equals(payloads(30_000)), where
        assert replica.lookups() == (hits, misses + 1), where  # never kept
        assert replica.held() <= CACHE_BYTES
    after = replica.sample("lake_query_scan_cache_fills_total", outcome="too_large")
    assert after == too_large + 2


@pytest.mark.parametrize("where", ["data", "main"])
def test_a_client_that_stops_mid_stream_leaves_no_partial_entry(
    replica: Replica, where: str
) -> None:
    # 19.2 MB (it fits the cache), one statement per path.
    sql = f"SELECT * FROM {MEDIUM.qualified} WHERE id >= {dict(data=0, main=-1)[where]}"
    (ticket,) = replica.plan(sql)
    abandoned = replica.sample("lake_query_scan_cache_fills_total", outcome="abandoned")
    uri = (
        f"grpc+tcp://{replica.process.env[QUERY_DATA_ADDR]}"
        if where == "data"
        else f"grpc+tcp://{replica.process.addr}"
    )
    admitted = replica.sample("lake_query_scan_cache_fills_total", outcome="admitted")
    with flight.FlightClient(uri, generic_options=NEVER_READING) as stalled:
        reader = stalled.do_get(ticket, options("alice"))
        assert reader.read_chunk().data.num_rows > 0
        reader.cancel()

    def ended() -> tuple[float, float]:
        return (
            replica.sample("lake_query_scan_cache_fills_total", outcome="abandoned") - abandoned,
            replica.sample("lake_query_scan_cache_fills_total", outcome="admitted") - admitted,
        )

    until(lambda: sum(ended()) == 1)
    dropped, whole = ended()
    if where == "data":
        # pyarrow's server asks for a batch only once the last was written: the
        # scan stopped with the client, and what it had kept was dropped.
        assert (dropped, whole) == (1, 0)
    # The grpcio listener produces messages ahead of the client (up to four
    # messages and gRPC's buffers), so it may have finished the scan before the
    # client went: then the whole scan was kept, never a part of it.
    hits, misses = replica.lookups()
    got = replica.read([ticket], where)
    assert got.sort_by("id").equals(wide(600_000))
    assert replica.lookups() == ((hits, misses + 1) if dropped else (hits + 1, misses))
    assert replica.read([ticket], where).equals(got)
    assert replica.lookups() == ((hits + 1, misses + 1) if dropped else (hits + 2, misses))


def test_a_caller_without_access_is_refused_however_warm_the_cache(replica: Replica) -> None:
    sql = f"SELECT * FROM {SMALL.qualified} WHERE id < 500"
    tickets = replica.plan(sql)
    expected = replica.read(tickets, "data")
    replica.read(tickets, "data")  # kept, and hit
    hits, misses = replica.lookups()
    with pytest.raises(flight.FlightUnauthorizedError, match="permission denied"):
        replica.plan(sql, who="bob")
    for where in ("data", "main"):
        with pytest.raises(flight.FlightUnauthorizedError, match="another principal"):
            replica.read(tickets, where, who="bob")
        # Another principal granted the table holds its own ticket: not alice's.
        with pytest.raises(flight.FlightUnauthorizedError, match="another principal"):
            replica.read(tickets, where, who="amy")
    assert replica.lookups() == (hits, misses)  # refused before the cache is asked
    # A principal granted the same table reads the same rows, from the same kept scan.
    assert replica.read(replica.plan(sql, who="amy"), "data", who="amy").equals(expected)
    assert replica.lookups() == (hits + 1, misses)


def test_zero_turns_the_cache_off(lake: Lake) -> None:
    off = lake.start_replica(
        {QUERY_SCAN_CACHE_BYTES: "0", QUERY_DATA_ADDR: f"127.0.0.1:{free_port()}"}
    )
    try:
        tickets = off.plan(f"SELECT * FROM {SMALL.qualified}")
        first = off.read(tickets, "data")
        assert off.read(tickets, "data").equals(first)
        assert off.read(tickets, "main").equals(first)
        assert off.lookups() == (0, 0)
        assert off.held() == 0
    finally:
        stop(off)
