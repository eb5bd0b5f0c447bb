"""Time travel through real processes, with ADBC, pyarrow Flight and the SDK.

One table, created (v0), appended three times (v1-v3) and compacted (v3
again, on a new Lance version): every version reads exactly its rows by
number and by instant, two versions join, ``$versions`` lists the history,
tickets keep their versions across a later append, and a second cluster
keeping two Lance versions fails reclaimed versions explicitly.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import lance
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from click.testing import CliRunner
from google.protobuf import any_pb2

import lake_sdk
from lake_core.admin_cli import client as admin_cli
from lake_core.config import COMPACTION, LANCE_RETAIN_MIN_AGE_SECS, LANCE_RETAIN_VERSIONS
from lake_core.models import TableDescriptor
from lake_core.proto import flight_sql_pb2
from lake_query.planning.version_starts import MARGIN_MS
from lake_query.planning.versions import history, lance_steps, versions_table
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import LakeCluster, write_ticket_keys

ROWS = 5
TABLE = "lake.robots.episodes"


def at(selector: str) -> str:
    return f'lake.robots."episodes{selector}"'


def expected(version: int) -> pa.Table:
    if version == 0:
        return EPISODES_SCHEMA.empty_table()
    return pa.Table.from_batches([episodes(0, ROWS * version)])


def same_rows(got: pa.Table, want: pa.Table) -> None:
    got = got.select(EPISODES_SCHEMA.names).cast(EPISODES_SCHEMA).sort_by("steps")
    assert got.equals(want.sort_by("steps")), (got.num_rows, want.num_rows)


def statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def flight_query(client: flight.FlightClient, sql: str) -> pa.Table:
    info = client.get_flight_info(statement(sql))
    return client.do_get(info.endpoints[0].ticket).read_all()


def adbc_query(url: str, sql: str) -> pa.Table:
    with flightsql.connect(url) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetch_arrow_table()


def eventually(check: Callable[[], None], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def cluster(root: Path, env: dict[str, str]) -> LakeCluster:
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(root / "ticket-keys.json")),
        COMPACTION: "off",
        **env,
    }
    return LakeCluster.start(root, env)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LakeCluster]:
    """v0 create, v1-v3 appends of ROWS rows, then a compaction of v3."""
    running = cluster(tmp_path_factory.mktemp("timetravel"), {})
    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with lake_sdk.Client(running.query.url) as client:
            for version in range(1, 4):
                assert client.append_batches(EPISODES, [episodes((version - 1) * ROWS, ROWS)]) == (
                    version
                )
            result = CliRunner().invoke(
                admin_cli,
                ["--addr", running.meta.addr, "optimize-table", str(EPISODES)],
                catch_exceptions=False,
            )
            assert result.exit_code == 0, result.output
            assert json.loads(result.output)["changed"]

            def compacted() -> None:
                assert client.versions(EPISODES).column("operation")[-1].as_py() == "maintenance"

            eventually(compacted)
        yield running
    finally:
        running.stop()


def test_versions_lists_the_history(lake: LakeCluster) -> None:
    with lake_sdk.Client(lake.query.url) as client:
        listing = client.versions("robots.episodes")
    assert listing.schema.names == [
        "version",
        "committed_at",
        "operation",
        "rows_added",
        "engine_version",
        "operation_ids",
    ]
    assert listing.schema.field("committed_at").type == pa.timestamp("us", tz="UTC")
    assert listing.column("version").to_pylist() == [0, 1, 2, 3, 3]
    assert listing.column("operation").to_pylist() == [
        "create",
        "append",
        "append",
        "append",
        "maintenance",
    ]
    assert listing.column("rows_added").to_pylist() == [0, ROWS, ROWS, ROWS, 0]
    # Each append here came alone: its version holds its one operation id.
    held = listing.column("operation_ids").to_pylist()
    assert [len(ids) for ids in held] == [0, 1, 1, 1, 0]
    assert len({ids[0] for ids in held[1:4]}) == 3
    engine = listing.column("engine_version").to_pylist()
    assert engine == sorted(set(engine))
    stamps = listing.column("committed_at").to_pylist()
    assert stamps == sorted(stamps)
    assert datetime.now(UTC) - timedelta(minutes=10) < stamps[0]
    # The same rows through both standard clients.
    sql = f"SELECT * FROM {at('$versions')} ORDER BY engine_version"
    assert adbc_query(lake.query.url, sql).equals(listing)
    with flight.FlightClient(f"grpc+tcp://{lake.query.addr}") as client:
        assert flight_query(client, sql).equals(listing)


def test_each_version_reads_exactly_its_rows(lake: LakeCluster) -> None:
    with (
        lake_sdk.Client(lake.query.url) as sdk,
        flight.FlightClient(f"grpc+tcp://{lake.query.addr}") as client,
    ):
        for version in range(4):
            want = expected(version)
            same_rows(sdk.query_table(f"SELECT * FROM {TABLE}", as_of=version), want)
            same_rows(adbc_query(lake.query.url, f"SELECT * FROM {at(f'@v{version}')}"), want)
            same_rows(flight_query(client, f"SELECT * FROM {at(f'@v{version}')}"), want)


def test_instants_between_commits_pick_the_version_current_then(lake: LakeCluster) -> None:
    with lake_sdk.Client(lake.query.url) as sdk:
        listing = sdk.versions(EPISODES).to_pylist()
        for before, after in itertools.pairwise(listing):
            between = before["committed_at"] + (after["committed_at"] - before["committed_at"]) / 2
            same_rows(
                sdk.query_table(f"SELECT * FROM {TABLE}", as_of=between),
                expected(before["version"]),
            )
        newest = listing[-1]["committed_at"]
        text = newest.isoformat().replace("+00:00", "Z")
        same_rows(adbc_query(lake.query.url, f"SELECT * FROM {at('@' + text)}"), expected(3))
        with pytest.raises(lake_sdk.InvalidArgument, match="did not exist"):
            sdk.query_table(
                f"SELECT * FROM {TABLE}", as_of=listing[0]["committed_at"] - timedelta(seconds=1)
            )


def test_two_versions_of_one_table_join_in_ctes_and_subqueries(lake: LakeCluster) -> None:
    sql = f"""
    WITH old AS (SELECT episode_id FROM {at("@v1")})
    SELECT n.episode_id FROM {at("@v3")} n
    LEFT JOIN old ON n.episode_id = old.episode_id
    WHERE old.episode_id IS NULL
      AND n.steps IN (SELECT steps FROM {at("@v2")})
    ORDER BY n.episode_id
    """
    want = [f"ep-{i:07d}" for i in range(ROWS, 2 * ROWS)]
    assert adbc_query(lake.query.url, sql).column("episode_id").to_pylist() == want
    with flight.FlightClient(f"grpc+tcp://{lake.query.addr}") as client:
        assert flight_query(client, sql).column("episode_id").to_pylist() == want
    with lake_sdk.Client(lake.query.url) as sdk:
        assert sdk.query_table(sql).column("episode_id").to_pylist() == want


def test_future_versions_and_instants_are_invalid_arguments(lake: LakeCluster) -> None:
    future = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with lake_sdk.Client(lake.query.url) as sdk:
        with pytest.raises(lake_sdk.InvalidArgument, match="no version 99"):
            sdk.query_table(f"SELECT * FROM {TABLE}", as_of=99)
        with pytest.raises(lake_sdk.InvalidArgument, match="in the future"):
            sdk.query_table(f"SELECT * FROM {at('@' + future)}")
        with pytest.raises(lake_sdk.InvalidArgument, match="UTC"):
            sdk.query_table(f"SELECT * FROM {at('@2026-11-30T12:00:00+01:00')}")
        with pytest.raises(lake_sdk.InvalidArgument, match="metadata table"):
            sdk.query_table(f"SELECT * FROM {at('$snapshots')}")
    with pytest.raises(adbc_driver_manager.Error, match="no version 99"):
        adbc_query(lake.query.url, f"SELECT * FROM {at('@v99')}")
    with (
        flight.FlightClient(f"grpc+tcp://{lake.query.addr}") as client,
        pytest.raises(pa.ArrowInvalid, match="in the future"),
    ):
        flight_query(client, f"SELECT * FROM {at('@' + future)}")


def test_pins_survive_a_later_append(tmp_path: Path) -> None:
    running = cluster(tmp_path, {})
    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with (
            lake_sdk.Client(running.query.url) as sdk,
            flight.FlightClient(f"grpc+tcp://{running.query.addr}") as client,
        ):
            sdk.append_batches(EPISODES, [episodes(0, ROWS)])
            sdk.append_batches(EPISODES, [episodes(ROWS, ROWS)])
            old = client.get_flight_info(statement(f"SELECT * FROM {at('@v1')}"))
            now = client.get_flight_info(statement(f"SELECT * FROM {TABLE}"))
            listed = client.get_flight_info(statement(f"SELECT * FROM {at('$versions')}"))
            assert sdk.append_batches(EPISODES, [episodes(2 * ROWS, ROWS)]) == 3
            same_rows(client.do_get(old.endpoints[0].ticket).read_all(), expected(1))
            same_rows(client.do_get(now.endpoints[0].ticket).read_all(), expected(2))
            # The listing is pinned to the head it was planned at.
            pinned = client.do_get(listed.endpoints[0].ticket).read_all()
            assert pinned.column("version").to_pylist() == [0, 1, 2]
            same_rows(sdk.query_table(f"SELECT * FROM {at('@v1')}"), expected(1))
            same_rows(sdk.query_table(f"SELECT * FROM {TABLE}"), expected(3))
    finally:
        running.stop()


def test_reclaimed_versions_fail_explicitly(tmp_path: Path) -> None:
    running = cluster(tmp_path, {LANCE_RETAIN_VERSIONS: "2", LANCE_RETAIN_MIN_AGE_SECS: "0"})
    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with (
            lake_sdk.Client(running.query.url) as sdk,
            flight.FlightClient(f"grpc+tcp://{running.query.addr}") as client,
        ):
            for i in range(3):
                sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])
                if i == 0:
                    at_v1 = datetime.now(UTC)  # an instant whose version (1) will be reclaimed
            ticket = client.get_flight_info(statement(f"SELECT * FROM {at('@v3')}"))
            for i in range(3, 5):
                sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])
            # Two Lance versions are kept: v4 and v5; everything older is gone.
            assert sdk.versions(EPISODES).column("version").to_pylist() == [4, 5]
            same_rows(sdk.query_table(f"SELECT * FROM {TABLE}", as_of=4), expected(4))
            with pytest.raises(lake_sdk.VersionReclaimed):
                sdk.query_table(f"SELECT * FROM {TABLE}", as_of=1)
            with pytest.raises(lake_sdk.VersionReclaimed):
                sdk.query_table(f"SELECT * FROM {TABLE}", as_of=at_v1)
            # Before the table existed is the caller's mistake, reclaimed or not.
            with pytest.raises(lake_sdk.InvalidArgument):
                sdk.query_table(
                    f"SELECT * FROM {TABLE}", as_of=datetime.now(UTC) - timedelta(days=1)
                )
            with pytest.raises(adbc_driver_manager.Error, match="no longer available"):
                adbc_query(running.query.url, f"SELECT * FROM {at('@v2')}")
            # pyarrow reports FAILED_PRECONDITION as ArrowInvalid, with the status named.
            with pytest.raises(pa.ArrowInvalid, match=r"precondition failed.*no longer available"):
                client.do_get(ticket.endpoints[0].ticket).read_all()
    finally:
        running.stop()


def test_far_versions_are_walked_to_from_metasrvs_record(tmp_path: Path) -> None:
    """Selectors far from the head start their walk where Metasrv's registry says.

    Every version and the instants around each commit read exactly their rows
    (the walk from Metasrv's start against the rows each version was given).
    Then an unreadable manifest far above them: a replica that has read no
    manifest yet still resolves them, which a walk from the head cannot.
    """
    appends = 24
    (tmp_path / "lake").mkdir()
    running = cluster(tmp_path / "lake", {})
    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with lake_sdk.Client(running.query.url) as sdk:
            for version in range(1, appends + 1):
                sdk.append_batches(EPISODES, [episodes((version - 1) * ROWS, ROWS)])
                if version == 6:  # instants up to v5 become older than the start's margin
                    time.sleep(MARGIN_MS / 1000 + 0.5)
            listing = sdk.versions(EPISODES).to_pylist()
            assert [v["version"] for v in listing] == list(range(appends + 1))
            for version in range(appends + 1):
                same_rows(
                    sdk.query_table(f"SELECT * FROM {TABLE}", as_of=version), expected(version)
                )
            for before, after in itertools.pairwise(listing):
                between = (
                    before["committed_at"] + (after["committed_at"] - before["committed_at"]) / 2
                )
                for instant, version in (
                    (before["committed_at"], before["version"]),
                    (between, before["version"]),
                ):
                    same_rows(
                        sdk.query_table(f"SELECT * FROM {TABLE}", as_of=instant), expected(version)
                    )
        (location,) = (tmp_path / "lake").rglob("episodes.lance")
        far = next(v for v in listing if v["version"] == 20)["engine_version"]
        (location / "_versions" / f"{(1 << 64) - 1 - far}.manifest").write_bytes(b"not a manifest")
        fresh = running.add_query()
        with lake_sdk.Client(fresh.url) as sdk:
            same_rows(sdk.query_table(f"SELECT * FROM {at('@v5')}"), expected(5))
            same_rows(
                sdk.query_table(f"SELECT * FROM {TABLE}", as_of=listing[5]["committed_at"]),
                expected(5),
            )
    finally:
        running.stop()


def test_the_docs_example_runs_twice(lake: LakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "time-travel.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert blocks
    for _ in range(2):
        for block in blocks:
            code = block.replace("grpc://127.0.0.1:50051", lake.query.url)
            exec(compile(code, "docs/time-travel.md", "exec"), {"__name__": "__main__"})
        out = capsys.readouterr().out
        assert "'operation': 'maintenance'" in out
        assert f"rows at version 1: {ROWS}" in out
        assert f"rows now: {3 * ROWS}" in out


def test_a_busy_history_lists_as_the_walk_through_lance_does(tmp_path: Path) -> None:
    """``$versions`` (read from the ends of Lance's files) equals the walk through Lance.

    Through real processes: appends alone and concurrent (commit groups), a
    compaction, retention keeping a few versions, then a drop and recreate;
    after each, the listing a fresh replica serves equals the rows the walk
    through every manifest gives at the same head.
    """
    (tmp_path / "lake").mkdir()
    running = cluster(
        tmp_path / "lake", {LANCE_RETAIN_VERSIONS: "6", LANCE_RETAIN_MIN_AGE_SECS: "0"}
    )

    def same_as_the_walk(sdk: lake_sdk.Client) -> None:
        listing = sdk.versions(EPISODES)
        fresh = running.add_query()
        with lake_sdk.Client(fresh.url) as other:
            assert other.versions(EPISODES).to_pylist() == listing.to_pylist()
        newest = listing.to_pylist()[-1]
        # The newest dataset of the table (a recreated table starts a fresh one).
        location = max(
            (tmp_path / "lake").rglob("episodes*.lance"), key=lambda p: p.stat().st_mtime_ns
        )
        head = TableDescriptor(
            location=str(location),
            incarnation="-",
            version=newest["version"],
            engine_version=newest["engine_version"],
        )
        dataset = lance.dataset(str(location), version=head.engine_version)
        walked = versions_table(history(dataset, head, lance_steps(dataset)))
        assert listing.to_pylist() == walked.to_pylist()

    try:
        create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
        with lake_sdk.Client(running.query.url) as sdk:
            for i in range(4):
                sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda i: sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)]),
                        range(4, 12),
                    )
                )
            same_as_the_walk(sdk)
            result = CliRunner().invoke(
                admin_cli,
                ["--addr", running.meta.addr, "optimize-table", str(EPISODES)],
                catch_exceptions=False,
            )
            assert result.exit_code == 0, result.output
            sdk.append_batches(EPISODES, [episodes(100, ROWS)])
            same_as_the_walk(sdk)
            assert any(len(ids) > 1 for ids in sdk.versions(EPISODES)["operation_ids"].to_pylist())
            result = CliRunner().invoke(
                admin_cli,
                ["--addr", running.meta.addr, "drop-table", str(EPISODES)],
                catch_exceptions=False,
            )
            assert result.exit_code == 0, result.output
            create_table(running.meta.addr, EPISODES, EPISODES_SCHEMA)
            for i in range(3):
                sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])
            same_as_the_walk(sdk)
            assert sdk.versions(EPISODES)["version"].to_pylist() == [0, 1, 2, 3]
    finally:
        running.stop()
