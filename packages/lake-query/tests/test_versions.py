"""Time travel in the planner: selectors, Lance history, pins, listing."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.dataset import Transaction

from lake_core.cloud import DatasetStorage
from lake_core.config import MANIFEST_DYNAMODB_TABLE
from lake_core.errors import InvalidArgument, InvalidName, PermissionDenied, VersionReclaimed
from lake_core.models import CatalogEntry, TableDescriptor, incarnation_metadata
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_core.schemas import schema_to_base64
from lake_query.planning import DatasetOpener, PinnedDatasets, Planner, QuerySpec
from lake_query.planning.versions import parse_table_name
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3

from .conftest import ROBOTS_ONLY, LocalCatalog, episodes


def rows(planner: Planner, sql: str) -> pa.Table:
    spec = planner.plan(sql, DEV_PRINCIPAL).spec
    stream = planner.execute(spec, DEV_PRINCIPAL)
    return pa.Table.from_batches(list(stream), schema=stream.schema)


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("episode_id").to_pylist())


@pytest.fixture
def history(catalog: LocalCatalog) -> LocalCatalog:
    """Lake versions 1 (create, 2 rows), 2 (+3), 3 (+1), then a compaction of 3."""
    catalog.create("robots.episodes", episodes(0, 2))
    catalog.append("robots.episodes", episodes(2, 3))
    catalog.append("robots.episodes", episodes(5, 1))
    entry = catalog.entries[TableRef("robots", "episodes")]
    dataset = lance.dataset(entry.descriptor.location)
    dataset.optimize.compact_files()
    catalog._register(
        entry.table,
        entry.descriptor.incarnation,
        entry.descriptor.version,
        int(lance.dataset(entry.descriptor.location).version),
        episodes(0, 1).schema,
    )
    return catalog


def test_selectors_parse_before_any_io() -> None:
    assert parse_table_name("t").selector is None
    assert parse_table_name("t@v3").version == 3
    assert parse_table_name("t$versions").listing
    instant = parse_table_name("t@2026-11-30T12:00:00.5Z").instant
    assert instant == datetime(2026, 11, 30, 12, 0, 0, 500000, tzinfo=UTC)
    assert parse_table_name("t@2026-11-30T12:00:00+00:00").instant is not None
    for bad in ("t@3", "t@vx", "t@2026-11-30", "t@2026-11-30T12:00:00+02:00", "t$snapshots"):
        with pytest.raises(InvalidArgument):
            parse_table_name(bad)
    with pytest.raises(InvalidArgument, match="valid date"):
        parse_table_name("t@2026-02-30T12:00:00Z")


@pytest.mark.parametrize(
    "text",
    [
        "t@v\u0666",  # ARABIC-INDIC DIGIT SIX
        "t@v\uff16",  # FULLWIDTH DIGIT SIX
        "t@v1\u0663",
        "t@\uff12026-11-30T12:00:00Z",
        "t@2026-11-30T12:00:0\u0665Z",
    ],
)
def test_selectors_take_ascii_digits_only(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_table_name(text)


def test_each_version_reads_its_own_rows(history: LocalCatalog) -> None:
    planner = Planner(history.resolve, history.refs)
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v1"')) == [0, 1]
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v2"')) == list(range(5))
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v3"')) == list(range(6))
    assert ids(rows(planner, "SELECT * FROM lake.robots.episodes")) == list(range(6))


def test_two_versions_of_one_table_are_two_pins(history: LocalCatalog) -> None:
    planner = Planner(history.resolve, history.refs)
    sql = (
        'WITH old AS (SELECT episode_id FROM lake.robots."episodes@v1") '
        'SELECT n.episode_id FROM lake.robots."episodes@v2" n '
        "LEFT JOIN old ON n.episode_id = old.episode_id WHERE old.episode_id IS NULL"
    )
    spec = planner.plan(sql, DEV_PRINCIPAL).spec
    assert [p.name for p in spec.pins] == ["episodes@v1", "episodes@v2"]
    # Execution reads the pins alone, even after a later append.
    history.append("robots.episodes", episodes(6, 4))
    stream = planner.execute(QuerySpec.model_validate(spec.model_dump()), DEV_PRINCIPAL)
    assert ids(pa.Table.from_batches(list(stream), schema=stream.schema)) == [2, 3, 4]


def test_versions_listing(history: LocalCatalog) -> None:
    planner = Planner(history.resolve, history.refs)
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions" ORDER BY engine_version')
    assert listing.column_names == [
        "version",
        "committed_at",
        "operation",
        "rows_added",
        "engine_version",
        "operation_ids",
    ]
    assert listing.column("version").to_pylist() == [1, 2, 3, 3]
    assert listing.column("operation").to_pylist() == ["create", "append", "append", "maintenance"]
    assert listing.column("rows_added").to_pylist() == [2, 3, 1, 0]
    head = history.entries[TableRef("robots", "episodes")].descriptor.engine_version
    assert listing.column("engine_version").to_pylist() == [1, 2, 3, head]
    assert listing.schema.field("committed_at").type == pa.timestamp("us", tz="UTC")
    stamps = listing.column("committed_at").to_pylist()
    assert stamps == sorted(stamps)
    now = datetime.now(UTC)
    assert all(now - timedelta(minutes=5) < s <= now for s in stamps)


def test_instants_pick_the_version_current_then(history: LocalCatalog) -> None:
    planner = Planner(history.resolve, history.refs)
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions"')
    stamps = dict(
        zip(
            listing.column("engine_version").to_pylist(),
            listing.column("committed_at").to_pylist(),
            strict=True,
        )
    )

    def at(instant: datetime) -> list[int]:
        text = instant.isoformat().replace("+00:00", "Z")
        return ids(rows(planner, f'SELECT * FROM lake.robots."episodes@{text}"'))

    assert at(stamps[1]) == [0, 1]
    assert at(stamps[2] - (stamps[2] - stamps[1]) / 2) == [0, 1]
    assert at(stamps[2]) == list(range(5))
    assert at(max(stamps.values())) == list(range(6))
    with pytest.raises(InvalidArgument, match="did not exist"):
        at(stamps[1] - timedelta(seconds=1))
    with pytest.raises(InvalidArgument, match="future"):
        at(datetime.now(UTC) + timedelta(hours=1))


def test_future_and_reclaimed_versions_fail_explicitly(history: LocalCatalog) -> None:
    planner = Planner(history.resolve, history.refs)
    with pytest.raises(InvalidArgument, match="no version 4"):
        planner.plan('SELECT * FROM lake.robots."episodes@v4"', DEV_PRINCIPAL)
    with pytest.raises(InvalidName):
        planner.plan('SELECT * FROM lake.robots."Episodes@v1"', DEV_PRINCIPAL)
    spec = planner.plan('SELECT * FROM lake.robots."episodes@v2"', DEV_PRINCIPAL).spec
    location = history.entries[TableRef("robots", "episodes")].descriptor.location
    lance.dataset(location).cleanup_old_versions(
        older_than=timedelta(0), retain_versions=1, error_if_tagged_old_versions=False
    )
    with pytest.raises(VersionReclaimed):
        planner.plan('SELECT * FROM lake.robots."episodes@v1"', DEV_PRINCIPAL)
    with pytest.raises(VersionReclaimed):
        list(planner.execute(spec, DEV_PRINCIPAL))
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions"')
    head = history.entries[TableRef("robots", "episodes")].descriptor.engine_version
    assert listing.column("engine_version").to_pylist() == [head]


def test_a_version_near_the_head_reads_no_older_manifest(history: LocalCatalog) -> None:
    """Planning walks back from the head only as far as the selector asks.

    Listing every retained version read each manifest on every plan (seconds
    per plan at thousands of versions) and failed with an untyped "Not found"
    when retention deleted one between the listing and the read. An unreadable
    old manifest stands in for both: a plan that does not need it must not read it.
    """
    planner = Planner(history.resolve, history.refs)
    location = history.entries[TableRef("robots", "episodes")].descriptor.location
    oldest = sorted((Path(location) / "_versions").glob("*.manifest"))[-1]  # Lance version 1
    oldest.write_bytes(b"not a manifest")
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v3"')) == list(range(6))
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v2"')) == list(range(5))
    listing = rows(planner, 'SELECT version FROM lake.robots."episodes$versions"')
    assert sorted(listing.column("version").to_pylist()) == [2, 3, 3]  # down to it


def test_an_instant_before_the_table_existed_is_invalid_after_reclaiming(
    history: LocalCatalog,
) -> None:
    planner = Planner(history.resolve, history.refs)
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions"')
    created = min(listing.column("committed_at").to_pylist())
    location = history.entries[TableRef("robots", "episodes")].descriptor.location
    lance.dataset(location).cleanup_old_versions(
        older_than=timedelta(0), retain_versions=1, error_if_tagged_old_versions=False
    )

    def at(instant: datetime) -> str:
        text = instant.isoformat().replace("+00:00", "Z")
        return f'SELECT * FROM lake.robots."episodes@{text}"'

    # The creation version is gone, yet an instant before it is still not a reclaimed one.
    with pytest.raises(InvalidArgument, match="did not exist"):
        planner.plan(at(created - timedelta(hours=1)), DEV_PRINCIPAL)
    with pytest.raises(VersionReclaimed):
        planner.plan(at(created + timedelta(microseconds=1)), DEV_PRINCIPAL)


def test_orphans_behind_a_restore_are_never_listed(catalog: LocalCatalog) -> None:
    catalog.create("robots.episodes", episodes(0, 2))
    entry = catalog.entries[TableRef("robots", "episodes")]
    location = entry.descriptor.location
    # An append Lance committed but the registry never recorded (a crash).
    lance.write_dataset(episodes(100, 5), location, mode="append")
    latest = lance.dataset(location)
    restored = lance.LanceDataset.commit(
        latest, lance.LanceOperation.Restore(1), read_version=latest.version
    )
    lance.write_dataset(episodes(2, 1), location, mode="append")
    catalog._register(
        entry.table,
        entry.descriptor.incarnation,
        2,
        int(restored.version) + 1,
        episodes(0, 1).schema,
    )
    planner = Planner(catalog.resolve, catalog.refs)
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions"')
    assert listing.column("engine_version").to_pylist() == [1, 4]
    assert listing.column("version").to_pylist() == [1, 2]
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v2"')) == [0, 1, 2]


@pytest.mark.s3
@pytest.mark.dynamodb
def test_time_travel_on_an_s3_table(
    s3_server: SeaweedS3, s3_bucket: str, dynamodb_server: Dynalite, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**s3_server.env(), **dynamodb_server.env()}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # boto3 and Lance read credentials from the environment
    manifests = dynamodb_server.manifest_table()
    storage = DatasetStorage.from_env({**env, MANIFEST_DYNAMODB_TABLE: manifests})
    location = f"s3://{s3_bucket}/lake/robots/episodes.lance"
    data = episodes(0, 3)
    schema = data.schema.with_metadata(incarnation_metadata("inc-7"))
    uri, options = storage.lance_uri(location), storage.storage_options(location)
    lance.write_dataset(schema.empty_table(), uri, mode="create", storage_options=options)
    for start in (0, 3):
        written = lance.write_dataset(
            episodes(start, 3).replace_schema_metadata(schema.metadata),
            uri,
            mode="append",
            storage_options=options,
        )
    ref = TableRef("robots", "episodes")
    entry = CatalogEntry(
        table=ref,
        descriptor=TableDescriptor(
            location=location, incarnation="inc-7", version=2, engine_version=written.version
        ),
        schema_ipc=schema_to_base64(data.schema),
    )
    planner = Planner(
        {ref: entry}.get, lambda: [ref], datasets=DatasetOpener(storage, PinnedDatasets())
    )
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions"')
    assert listing.column("version").to_pylist() == [0, 1, 2]
    assert listing.column("operation").to_pylist() == ["create", "append", "append"]
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v1"')) == [0, 1, 2]
    with pytest.raises(InvalidArgument):
        planner.plan('SELECT * FROM lake.robots."episodes@v3"', DEV_PRINCIPAL)


def test_selectors_are_authorized_like_the_table(catalog: LocalCatalog) -> None:
    catalog.create("secret.episodes", episodes(0, 2))
    catalog.create("robots.episodes", episodes(0, 2))
    planner = Planner(catalog.resolve, catalog.refs)
    for name in ("episodes@v1", "episodes$versions", "episodes@2026-01-01T00:00:00Z"):
        with pytest.raises(PermissionDenied):
            planner.plan(f'SELECT * FROM lake.secret."{name}"', ROBOTS_ONLY)
        # Hidden and absent look the same.
        with pytest.raises(PermissionDenied):
            planner.plan(f'SELECT * FROM lake.secret."missing{name[8:]}"', ROBOTS_ONLY)
    assert rows_as(planner, 'SELECT * FROM lake.robots."episodes@v1"', ROBOTS_ONLY).num_rows == 2


def rows_as(planner: Planner, sql: str, principal: Principal) -> pa.Table:
    stream = planner.execute(planner.plan(sql, principal).spec, principal)
    return pa.Table.from_batches(list(stream), schema=stream.schema)


def test_the_listing_mixes_with_versions_in_one_statement(history: LocalCatalog) -> None:
    planner = Planner(history.resolve, history.refs)
    sql = (
        'SELECT e.episode_id FROM lake.robots."episodes@v2" e WHERE e.episode_id < '
        '(SELECT max(rows_added) FROM lake.robots."episodes$versions")'
    )
    assert ids(rows(planner, sql)) == [0, 1, 2]
    only = rows(planner, 'SELECT * FROM lake.robots."episodes$versions" WHERE version = 3')
    assert only.column("operation").to_pylist() == ["append", "maintenance"]


def test_the_listing_names_the_appends_each_version_holds(catalog: LocalCatalog) -> None:
    # Metasrv commits a commit group as one Lance version whose transaction
    # properties name its appends; the listing shows them per version.
    entry = catalog.create("robots.episodes", episodes(0, 2))
    dataset = lance.dataset(entry.descriptor.location)
    fragments = lance.fragment.write_fragments(episodes(2, 3), dataset)
    group = Transaction(
        read_version=dataset.version,
        operation=lance.LanceOperation.Append(fragments),
        transaction_properties={"lake.operation_ids": "op-a,op-b,op-c"},
    )
    committed = lance.LanceDataset.commit(dataset, group, read_version=dataset.version)
    ref = TableRef("robots", "episodes")
    catalog._register(
        ref, entry.descriptor.incarnation, 2, int(committed.version), episodes(0, 1).schema
    )
    planner = Planner(catalog.resolve, catalog.refs)
    sql = 'SELECT version, operation_ids FROM lake.robots."episodes$versions" ORDER BY version'
    assert rows(planner, sql).to_pylist() == [
        {"version": 1, "operation_ids": []},
        {"version": 2, "operation_ids": ["op-a", "op-b", "op-c"]},
    ]


def test_listing_versions_beside_reads_of_the_same_pinned_table(history: LocalCatalog) -> None:
    # The replica shares one pinned dataset between concurrent queries; listing its
    # versions reads transactions, which Lance does under a mutable borrow of the
    # dataset: "Already borrowed" / "Already mutably borrowed" for everyone else.
    planner = Planner(history.resolve, history.refs, datasets=DatasetOpener(cache=PinnedDatasets()))
    statements = [
        'SELECT count(*) AS n FROM lake.robots."episodes$versions"',
        "SELECT count(*) AS n FROM robots.episodes",
        "SELECT episode_id FROM robots.episodes WHERE episode_id < 3",
    ]
    failures: list[BaseException] = []

    def run(sql: str) -> None:
        for _ in range(25):
            try:
                rows(planner, sql)
            except BaseException as exc:  # collected: any failure fails the test
                failures.append(exc)

    threads = [threading.Thread(target=run, args=(statements[i % 3],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == [], failures[:3]


def test_a_far_version_is_walked_to_from_the_start_metasrv_names(catalog: LocalCatalog) -> None:
    """A walk from a start near the version selected reads no manifest above that start.

    Lake version v is Lance version v here (v1 is the creation). An unreadable
    manifest above the start stands in for the thousands a walk from the head
    would read: with a start, far versions and instants still resolve; from the
    head, the walk stops at it.
    """
    catalog.create("robots.episodes", episodes(0, 1))
    for start in range(1, 12):
        catalog.append("robots.episodes", episodes(start, 1))
    location = catalog.entries[TableRef("robots", "episodes")].descriptor.location
    lance_times = {v: _lance_time(location, v) for v in (3, 4)}
    manifest = Path(location) / "_versions" / f"{(1 << 64) - 1 - 8}.manifest"
    manifest.write_bytes(b"not a manifest")
    asked: list[str | None] = []

    def at_v4(ref: TableRef, head: TableDescriptor, wanted: Any) -> TableDescriptor:
        asked.append(wanted.selector)
        return head.model_copy(update={"version": 4, "engine_version": 4})

    between = lance_times[3] + (lance_times[4] - lance_times[3]) / 2
    instant = between.isoformat().replace("+00:00", "Z")
    for walk_start, works in ((at_v4, True), (None, False)):
        planner = Planner(catalog.resolve, catalog.refs, walk_start=walk_start)
        for selector in ("@v3", f"@{instant}"):
            sql = f'SELECT * FROM lake.robots."episodes{selector}"'
            if works:
                assert ids(rows(planner, sql)) == list(range(3))
            else:
                with pytest.raises(VersionReclaimed):
                    planner.plan(sql, DEV_PRINCIPAL)
    assert asked == ["@v3", f"@{instant}"]
    # A start retention reclaimed: so is everything older, reported as the head's walk would.
    (Path(location) / "_versions" / f"{(1 << 64) - 1 - 4}.manifest").unlink()
    planner = Planner(catalog.resolve, catalog.refs, walk_start=at_v4)
    with pytest.raises(VersionReclaimed):
        planner.plan('SELECT * FROM lake.robots."episodes@v3"', DEV_PRINCIPAL)
    with pytest.raises(InvalidArgument, match="did not exist"):
        planner.plan('SELECT * FROM lake.robots."episodes@2000-01-01T00:00:00Z"', DEV_PRINCIPAL)


def _lance_time(location: str, version: int) -> datetime:
    stamp: datetime = lance.dataset(location, version=version).get_version()["timestamp"]
    return stamp.astimezone(UTC)


def test_selectors_walk_past_a_compaction_of_an_indexed_table(catalog: LocalCatalog) -> None:
    # pylance cannot read back the transaction of a compaction that rewrote an
    # index (LanceOperation.RewrittenIndex: TypeError), so a walk through Lance
    # past one failed every selector behind it: SqlError with the TypeError's text.
    catalog.create("robots.episodes", episodes(0, 2))
    catalog.append("robots.episodes", episodes(2, 3))
    entry = catalog.append("robots.episodes", episodes(5, 1))
    location = entry.descriptor.location
    lance.dataset(location).create_scalar_index("episode_id", "BTREE")
    lance.dataset(location).optimize.compact_files()
    catalog._register(
        entry.table,
        entry.descriptor.incarnation,
        3,
        int(lance.dataset(location).version),
        episodes(0, 1).schema,
    )
    catalog.append("robots.episodes", episodes(6, 2))
    planner = Planner(catalog.resolve, catalog.refs)
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v1"')) == [0, 1]
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v3"')) == list(range(6))
    assert ids(rows(planner, 'SELECT * FROM lake.robots."episodes@v4"')) == list(range(8))
    listing = rows(planner, 'SELECT * FROM lake.robots."episodes$versions"')
    assert listing.column("operation").to_pylist() == [
        "create",
        "append",
        "append",
        "maintenance",
        "maintenance",
        "append",
    ]
