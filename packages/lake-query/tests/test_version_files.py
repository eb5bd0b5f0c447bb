"""``t$versions`` read from the ends of Lance's files equals the walk through Lance.

Generated histories (appends and commit groups, compactions, indexes, crash
orphans behind a Restore or above the head, small retention, drop and
recreate) are listed after every step both ways: through Lance's manifests
(:func:`lake_query.planning.versions.lance_steps`, the listing before) and
through :class:`lake_query.planning.version_files.VersionFiles`.
"""

from __future__ import annotations

import random
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from lance.dataset import Transaction

from lake_core.cloud import DatasetStorage
from lake_core.config import MANIFEST_DYNAMODB_TABLE
from lake_core.models import TableDescriptor, incarnation_metadata
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL
from lake_query.planning import DatasetOpener, Planner, version_files
from lake_query.planning.version_files import VersionFiles, manifest_facts, transaction_step
from lake_query.planning.versions import history, lance_steps, versions_table
from tools.lake_testing.dynalite import Dynalite
from tools.lake_testing.seaweed import SeaweedS3

from .conftest import LocalCatalog, episodes

SEEDS = range(6)


class Table:
    """One Lake table's Lance dataset and the head the registry would hold."""

    def __init__(self, location: Path, rng: random.Random) -> None:
        self.location = str(location)
        self.rng = rng
        self.created = 0
        self.create()

    def create(self) -> None:
        """Create, or drop and recreate (Lance's versions restart at 1)."""
        shutil.rmtree(self.location, ignore_errors=True)
        self.created += 1
        self.incarnation = f"inc-{self.created}"
        schema = pa.schema([("a", pa.int64())]).with_metadata(
            incarnation_metadata(self.incarnation)
        )
        rows = self.rng.randrange(3)
        data = pa.table({"a": list(range(rows))}, schema=schema)
        self.dataset = lance.write_dataset(data, self.location, schema=schema)
        self.version, self.engine = 0, int(self.dataset.version)
        self.restore_owed = False
        self.indexed = False

    def commit(self, operation: Any, properties: dict[str, str] | None = None) -> int:
        latest = lance.dataset(self.location)
        transaction = Transaction(
            read_version=latest.version,
            operation=operation,
            transaction_properties=properties,
        )
        return int(
            lance.LanceDataset.commit(latest, transaction, read_version=latest.version).version
        )

    def append(self, register: bool = True) -> None:
        """An append (a commit group of 1-3 operations), or an orphan a crash left."""
        if self.restore_owed and register:
            # Metasrv writes a Restore of its head over what it never registered.
            self.commit(lance.LanceOperation.Restore(self.engine))
            self.restore_owed = False
        data = pa.table({"a": list(range(self.rng.randrange(1, 5)))})
        fragments = lance.fragment.write_fragments(
            data, self.location, max_rows_per_file=self.rng.choice([1, 2, 10])
        )
        held = ",".join(f"op-{self.rng.randrange(10**6)}" for _ in range(self.rng.randrange(1, 4)))
        engine = self.commit(lance.LanceOperation.Append(fragments), {"lake.operation_ids": held})
        if register:
            self.version, self.engine = self.version + 1, engine
        else:
            self.restore_owed = True

    def maintain(self) -> None:
        """Compaction or an index: the same Lake version on a new Lance version."""
        if self.restore_owed:
            return
        dataset = lance.dataset(self.location)
        # pylance cannot read back a compaction's transaction once an index exists
        # (LanceOperation.RewrittenIndex: TypeError), so the walk through Lance
        # could not be compared past one: after an index, only index again.
        if self.indexed or self.rng.random() < 0.3:
            dataset.create_scalar_index("a", "BTREE", replace=True)
            self.indexed = True
        else:
            dataset.optimize.compact_files(target_rows_per_fragment=1_000)
        self.engine = int(lance.dataset(self.location).version)

    def reclaim(self) -> None:
        """Retention keeping only the newest few versions (and the head, as Lake's does)."""
        if self.restore_owed:
            return
        dataset = lance.dataset(self.location)
        dataset.cleanup_old_versions(
            older_than=timedelta(0), retain_versions=self.rng.randrange(1, 4)
        )

    @property
    def head(self) -> TableDescriptor:
        return TableDescriptor(
            location=self.location,
            incarnation=self.incarnation,
            version=self.version,
            engine_version=self.engine,
        )


def listings(table: Table, monkeypatch: pytest.MonkeyPatch) -> tuple[pa.Table, pa.Table, list[int]]:
    """The listing at ``table``'s head through Lance alone, and read ahead (and its Lance steps)."""
    head = table.head
    dataset = lance.dataset(table.location, version=head.engine_version)
    before = versions_table(history(dataset, head, lance_steps(dataset)))
    through_lance: list[int] = []

    def counted(dataset: Any) -> Any:
        read = lance_steps(dataset)

        def step(current: int) -> Any:
            through_lance.append(current)
            return read(current)

        return step

    with monkeypatch.context() as patched:
        patched.setattr(version_files, "lance_steps", counted)
        steps = version_files.VersionFiles(DatasetStorage()).steps(dataset, head)
        now = versions_table(history(dataset, head, steps))
    return before, now, through_lance


@pytest.mark.parametrize("seed", SEEDS)
def test_listing_from_files_equals_the_walk_through_lance(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    table = Table(tmp_path / "t.lance", rng)
    actions = [table.append] * 6 + [
        lambda: table.append(register=False),
        table.maintain,
        table.reclaim,
        table.create,
    ]
    kinds: set[str] = set()
    for action in [table.append, table.maintain] + [rng.choice(actions) for _ in range(40)]:
        action()
        before, now, through_lance = listings(table, monkeypatch)
        assert now.to_pylist() == before.to_pylist()
        assert now.schema == before.schema
        kinds.update(now.column("operation").to_pylist())
        # Only a create's version (its rows are its manifest's total) and the end of
        # the retained history are read through Lance.
        creates = now.filter(pa.compute.equal(now["operation"], "create")).num_rows
        assert len(through_lance) <= creates + 1, through_lance
    assert kinds == {"create", "append", "maintenance"}


def test_the_listing_reads_no_append_manifest_through_lance(
    catalog: LocalCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each append's manifest lists every fragment of the table: decoding all of them
    # made listing a busy uncompacted table quadratic (3,000 versions: over 20 s).
    catalog.create("robots.episodes", episodes(0, 2))
    for start in range(2, 12):
        catalog.append("robots.episodes", episodes(start, 1))
    checked_out: list[int] = []
    checkout = lance.LanceDataset.checkout_version

    def counting(self: Any, version: int) -> Any:
        checked_out.append(version)
        return checkout(self, version)

    monkeypatch.setattr(lance.LanceDataset, "checkout_version", counting)
    planner = Planner(catalog.resolve, catalog.refs)
    spec = planner.plan('SELECT * FROM lake.robots."episodes$versions"', DEV_PRINCIPAL).spec
    stream = planner.execute(spec, DEV_PRINCIPAL)
    listing = pa.Table.from_batches(list(stream), schema=stream.schema)
    assert listing.column("version").to_pylist() == list(range(1, 12))
    assert listing.column("rows_added").to_pylist() == [2] + [1] * 10
    assert set(checked_out) == {1}  # the create's, for its rows; no append's
    assert catalog.entries[TableRef("robots", "episodes")].descriptor.version == 11


def test_a_manifest_end_that_is_not_certain_reads_nothing() -> None:
    assert manifest_facts(b"", 3) is None
    assert manifest_facts(b"\x18\x03" + b"\x00" * 12 + b"LANC", 3) is None  # no timestamp
    assert manifest_facts(b"\x18\x03" * 40 + b"\x00" * 12 + b"LANX", 3) is None
    when = datetime(2026, 1, 1, tzinfo=UTC)
    assert transaction_step(b"\x08\x01", when) is None  # no operation
    assert transaction_step(b"\x08\x01\xb2\x06\x00", when) is None  # an Overwrite: a create
    with pytest.raises(ValueError):
        transaction_step(b"\x08", when)  # cut short


def test_a_listing_falls_back_to_lance_when_the_store_is_unreadable(tmp_path: Path) -> None:
    table = Table(tmp_path / "t.lance", random.Random(7))
    for _ in range(3):
        table.append()
    head = table.head
    dataset = lance.dataset(table.location, version=head.engine_version)
    elsewhere = head.model_copy(update={"location": str(tmp_path / "nowhere")})
    steps = version_files.VersionFiles(DatasetStorage()).steps(dataset, elsewhere)
    assert versions_table(history(dataset, head, steps)).equals(
        versions_table(history(dataset, head))
    )


@pytest.mark.s3
@pytest.mark.dynamodb
def test_an_s3_table_lists_the_same_from_files(
    s3_server: SeaweedS3,
    s3_bucket: str,
    dynamodb_server: Dynalite,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {**s3_server.env(), **dynamodb_server.env()}
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # boto3 and Lance read credentials from the environment
    storage = DatasetStorage.from_env(
        {**env, MANIFEST_DYNAMODB_TABLE: dynamodb_server.manifest_table()}
    )
    location = f"s3://{s3_bucket}/lake/robots/episodes.lance"
    schema = pa.schema([("a", pa.int64())]).with_metadata(incarnation_metadata("inc-s3"))
    uri, options = storage.lance_uri(location), storage.storage_options(location)
    lance.write_dataset(schema.empty_table(), uri, mode="create", storage_options=options)
    for start in range(0, 12, 3):
        data = pa.table({"a": list(range(start, start + 3))}, schema=schema)
        written = lance.write_dataset(data, uri, mode="append", storage_options=options)
    written.optimize.compact_files()
    head = TableDescriptor(
        location=location,
        incarnation="inc-s3",
        version=4,
        engine_version=int(lance.dataset(uri, storage_options=options).version),
    )
    dataset = DatasetOpener(storage).open(TableRef("robots", "episodes"), head)
    through_lance: list[int] = []
    read = lance_steps(dataset)

    def counted(_dataset: Any) -> Any:
        def step(current: int) -> Any:
            through_lance.append(current)
            return read(current)

        return step

    monkeypatch.setattr(version_files, "lance_steps", counted)
    now = versions_table(history(dataset, head, VersionFiles(storage).steps(dataset, head)))
    assert now.to_pylist() == versions_table(history(dataset, head, read)).to_pylist()
    assert now.column("operation").to_pylist() == ["create"] + ["append"] * 4 + ["maintenance"]
    assert through_lance == [1]  # the create's rows; every other step came from the files
