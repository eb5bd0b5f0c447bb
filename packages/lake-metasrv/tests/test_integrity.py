"""Digests recorded at commit (appends and compaction) and what verify reports."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.ids import new_operation_id
from lake_core.integrity import DataFileDigest
from lake_core.names import TableRef
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.digests.base import VersionDigests
from lake_metasrv.digests.local import LocalDigestStore
from lake_metasrv.digests.verify import verify_table
from lake_metasrv.maintenance import CompactionSettings, Maintenance

T = TableRef("robots", "checked")
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.utf8())])


async def append(coordinator: CommitCoordinator, start: int) -> int:
    batch = pa.record_batch(
        [pa.array(range(start, start + 10), pa.int64()), pa.array([f"r{start}"] * 10)],
        schema=SCHEMA,
    )
    command = protocol.AppendCommand(table=T, operation_id=new_operation_id())
    return (await coordinator.append(command, SCHEMA, [batch])).version


def flip(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.asyncio
async def test_appends_and_compaction_are_recorded_and_a_flip_is_reported(
    coordinator: CommitCoordinator,
) -> None:
    store = LocalDigestStore.of(coordinator.data_dir.root, coordinator.engine)
    await coordinator.create_table(T, SCHEMA)
    for i in range(4):
        await append(coordinator, i * 10)
    before = await verify_table(coordinator, store, T, all_versions=True)
    assert before.ok
    assert (before.versions, before.files_checked, before.unrecorded) == ([0, 1, 2, 3, 4], 4, [])

    await Maintenance(coordinator, CompactionSettings()).compact(T)
    after = await verify_table(coordinator, store, T, all_versions=False)
    assert after.ok
    assert (after.files_checked, after.unrecorded) == (1, [])  # the compacted file is recorded

    record = await coordinator.describe_table(T)
    compacted = sorted(
        (Path(record.location) / "data").glob("*.lance"), key=lambda p: p.stat().st_mtime_ns
    )[-1]
    flip(compacted, compacted.stat().st_size // 2)
    broken = await verify_table(coordinator, store, T, all_versions=True)
    [problem] = broken.problems
    assert (problem.path, problem.problem, problem.versions) == (compacted.name, "sha256", [4])
    compacted.unlink()
    gone = await verify_table(coordinator, store, T, all_versions=False)
    assert [p.problem for p in gone.problems] == ["missing"]


class CountingStore(LocalDigestStore):
    """Counts the records it reads."""

    reads: list[str]

    def _read(self, incarnation: str, names: Sequence[str]) -> list[bytes]:
        self.reads.extend(names)
        return super()._read(incarnation, names)


def record_of(store: LocalDigestStore, version: int, paths: list[str]) -> tuple[str, bytes]:
    record = VersionDigests(
        table=T,
        incarnation="inc",
        version=version,
        files=[DataFileDigest(path=p, size_bytes=len(p), sha256=p * 2) for p in paths],
    )
    return store.name(version), json.dumps(record.model_dump(mode="json")).encode()


def test_digests_by_path_read_only_records_not_read_yet(tmp_path: Path) -> None:
    store = CountingStore(tmp_path, engine=None)  # type: ignore[arg-type]
    store.reads = []
    store._put("inc", [record_of(store, v, [f"f{v}"]) for v in range(1, 4)])
    assert set(store.digests_of("inc", ["f1", "f3"])) == {"f1", "f3"}
    assert sorted(store.reads) == ["1.json", "2.json", "3.json"]
    # Known paths are answered from memory; a new version's file reads only its record.
    store.reads.clear()
    assert set(store.digests_of("inc", ["f2"])) == {"f2"}
    assert store.reads == []
    store._put("inc", [record_of(store, 4, ["f4"])])
    assert store.digests_of("inc", ["f4", "f1"])["f4"].size_bytes == 2
    assert store.reads == ["4.json"]
    # A record rewritten under the same name (a failed commit's version reused) is read again.
    store.reads.clear()
    store._put("inc", [record_of(store, 4, ["f4b"])])
    assert set(store.digests_of("inc", ["f4b", "gone"])) == {"f4b"}
    assert store.reads == ["4.json"]
    # The uncached form still reads everything, as verify-table needs.
    assert set(store.recorded("inc")) == {"f1", "f2", "f3", "f4b"}
