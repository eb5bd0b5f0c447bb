"""A commit group's durable writes, made concurrently, against the one-at-a-time way.

The group path flushes Lance's new manifests and transactions while later
versions commit, and writes sidecars all at once; each must leave exactly
what the sequential path leaves (same files, same bytes, every new name flushed).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lake_core.ids import new_operation_id
from lake_core.names import TableRef
from lake_metasrv import engine as engine_module
from lake_metasrv.engine import WrittenFiles
from lake_metasrv.sidecars import LocalSidecarStore, ReferenceDelta

SCHEMA = pa.schema([("id", pa.int64())])
LISTED = ("_versions", "_transactions")


def _listing(dataset: Path) -> dict[str, set[str]]:
    return {name: set(os.listdir(dataset / name)) for name in LISTED}


@pytest.mark.parametrize("seed", range(4))
def test_every_new_manifest_and_transaction_is_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    location = tmp_path / "t.lance"
    dataset = lance.write_dataset(SCHEMA.empty_table(), location, schema=SCHEMA)
    for start in range(rng.randrange(0, 4)):  # some history before the group
        dataset = lance.write_dataset(
            pa.table({"id": [start]}, schema=SCHEMA), location, mode="append"
        )
    flushed: list[Path] = []
    monkeypatch.setattr(engine_module, "fsync_file", lambda path: flushed.append(Path(path)))
    monkeypatch.setattr(engine_module, "fsync_dir", lambda path: flushed.append(Path(path)))

    before = _listing(location)
    had_data_dir = (location / "data").is_dir()
    written = WrittenFiles(location)
    written.before_commits()
    for row in range(rng.randrange(1, 7)):
        fragments = lance.fragment.write_fragments(pa.table({"id": [row]}, schema=SCHEMA), dataset)
        dataset = lance.LanceDataset.commit(
            dataset, lance.LanceOperation.Append(fragments), read_version=dataset.version
        )
        if rng.random() < 0.7:  # the group calls it after each commit; sync_commits catches up
            written.after_commit()
    written.sync_commits()

    after = _listing(location)
    new_files = {location / name / entry for name in LISTED for entry in after[name] - before[name]}
    directories = {location / name for name in ("data", *LISTED)}
    if not had_data_dir:  # the group's first data file made data/: the root's entry too
        directories.add(location)
    assert new_files  # a manifest and a transaction per version
    assert sorted(flushed) == sorted(new_files | directories)  # each exactly once


def _delta(incarnation: str, version: int, rng: random.Random) -> ReferenceDelta:
    adds = [
        f"file:///stage/tenants/local/{rng.randrange(10**6)}.bin" for _ in range(rng.randrange(3))
    ]
    return ReferenceDelta(
        table=TableRef("ns", "t"),
        incarnation=incarnation,
        version=version,
        operation_id=new_operation_id(),
        adds=sorted(adds),
    )


@pytest.mark.parametrize("seed", range(4))
def test_group_sidecars_match_one_at_a_time(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    incarnations = [new_operation_id() for _ in range(rng.randrange(1, 3))]
    deltas = [
        _delta(rng.choice(incarnations), version, rng) for version in range(1, rng.randrange(2, 20))
    ]
    one_by_one = LocalSidecarStore(tmp_path / "single")
    grouped = LocalSidecarStore(tmp_path / "group")
    for delta in deltas:
        one_by_one.write_delta(delta)
    grouped.write_deltas(deltas)

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    assert files(tmp_path / "group") == files(tmp_path / "single")
    for delta in deltas:
        assert grouped.read_delta(delta.incarnation, delta.version) == delta
