"""The Lance side: restore-before-append, retention, incarnations, crashed creates."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest

from lake_core.errors import VersionReclaimed
from lake_core.ids import new_operation_id
from lake_core.models import incarnation_metadata, incarnation_of
from lake_core.protocol import AppendCommand
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.engine import local as local_engine


def command(kit: Any, **fields: Any) -> AppendCommand:
    return AppendCommand(table=kit.episodes, operation_id=new_operation_id(), **fields)


async def append(coord: CommitCoordinator, kit: Any, n: int, start: int) -> int:
    result = await coord.append(command(kit), kit.schema, [kit.make_batch(n, start)])
    return result.version


@pytest.mark.asyncio
async def test_create_records_incarnation_in_lance_schema(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    record = await coordinator.create_table(kit.episodes, kit.schema)
    dataset = lance.dataset(record.location)
    assert incarnation_of(dataset.schema.metadata) == record.incarnation
    assert dataset.version == record.engine_version
    assert dataset.count_rows() == 0
    assert record.version == 0
    assert record.schema.equals(kit.schema)


@pytest.mark.asyncio
async def test_unregistered_lance_version_never_becomes_visible(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    record = await coordinator.create_table(kit.episodes, kit.schema)
    assert await append(coordinator, kit, 3, start=0) == 1

    # A crash between the Lance commit and the registry commit leaves orphans.
    orphan = pa.Table.from_batches([kit.make_batch(5, start=1000)])
    lance.write_dataset(orphan, record.location, mode="append")
    lance.write_dataset(orphan, record.location, mode="append")
    orphan_latest = lance.dataset(record.location).latest_version

    assert await append(coordinator, kit, 2, start=10) == 2
    current = await coordinator.describe_table(kit.episodes)
    assert current.version == 2
    assert current.engine_version > orphan_latest
    rows = await coordinator.engine.read(current.location, current.engine_version)
    ids = sorted(rows.column("episode_id").to_pylist())
    assert ids == sorted(["ep-0", "ep-1", "ep-2", "ep-10", "ep-11"])
    # Lance's own latest is the registered version again: no orphan rows anywhere.
    assert lance.dataset(current.location).to_table().num_rows == 5

    history = await coordinator.registry.versions(current.incarnation)
    assert [v.version for v in history] == [0, 1, 2]
    engine_versions = [v.engine_version for v in history]
    assert engine_versions == sorted(engine_versions)
    for v in history:
        table = await coordinator.engine.read(current.location, v.engine_version)
        assert "ep-1000" not in table.column("episode_id").to_pylist()


@pytest.mark.asyncio
async def test_a_version_is_durable_in_one_fsync_pass_before_the_registry_moves(
    coordinator: CommitCoordinator, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file a group's version adds is fsync'd, together, before it is registered.

    The group's data files go in the same pass as the new manifest and
    transaction files (one round of fsyncs per commit, not one for the data
    and another for the manifest); the registry moves only after it.
    """
    events: list[tuple[str, set[Path]]] = []
    real_fsync = local_engine.fsync_together

    def recording(files: Any = (), dirs: Any = ()) -> None:
        files, dirs = list(files), list(dirs)
        real_fsync(files, dirs)
        events.append(("fsync", {Path(f) for f in [*files, *dirs]}))

    monkeypatch.setattr(local_engine, "fsync_together", recording)
    real_commit = coordinator.registry.commit_append

    async def registering(commit: Any) -> Any:
        events.append(("registry", set()))
        return await real_commit(commit)

    monkeypatch.setattr(coordinator.registry, "commit_append", registering)
    record = await coordinator.create_table(kit.episodes, kit.schema)
    events.clear()
    results = await asyncio.gather(*(append(coordinator, kit, 3, start=10 * i) for i in range(4)))
    described = await coordinator.describe_table(kit.episodes)
    assert set(results) == {described.version}  # one group, one version
    dataset = lance.dataset(record.location, version=described.engine_version)
    root = Path(record.location)
    data_files = {
        root / "data" / data_file.path
        for fragment in dataset.get_fragments()
        for data_file in fragment.metadata.files
    }
    assert data_files
    assert [kind for kind, _ in events] == ["fsync", "registry"]
    synced = events[0][1]
    assert data_files <= synced
    assert any(path.parent.name == "_versions" for path in synced)  # the new manifest
    assert {root / "data", root / "_versions"} <= synced  # their directory entries


@pytest.mark.asyncio
async def test_retention_keeps_newest_and_tagged(make_coordinator: Any, kit: Any) -> None:
    coord = make_coordinator(retain_versions=2, retain_min_age_secs=0)
    await coord.open()
    try:
        record = await coord.create_table(kit.episodes, kit.schema)
        await append(coord, kit, 1, start=0)
        tagged = (await coord.describe_table(kit.episodes)).engine_version
        lance.dataset(record.location).tags.create("keep", tagged)
        for i in range(1, 6):
            await append(coord, kit, 1, start=i)
        current = await coord.describe_table(kit.episodes)
        assert current.version == 6
        kept = sorted(v["version"] for v in lance.dataset(record.location).versions())
        assert kept == sorted({tagged, current.engine_version - 1, current.engine_version})
        with pytest.raises(VersionReclaimed):
            await coord.engine.read(record.location, record.engine_version)
        old = await coord.engine.read(record.location, tagged)
        assert old.column("episode_id").to_pylist() == ["ep-0"]
        latest = await coord.engine.read(record.location, current.engine_version)
        assert latest.num_rows == 6
    finally:
        await coord.close()


@pytest.mark.asyncio
async def test_retention_failure_does_not_fail_the_commit(
    coordinator: CommitCoordinator, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    await coordinator.create_table(kit.episodes, kit.schema)

    async def broken(*_: object) -> int:
        raise OSError("disk says no")

    monkeypatch.setattr(coordinator.engine, "cleanup", broken)
    assert await append(coordinator, kit, 1, start=0) == 1


@pytest.mark.asyncio
async def test_half_created_table_can_be_created_again(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    location = coordinator.location_for(kit.episodes)
    # A create that crashed after writing the dataset but before the registry row.
    stray = kit.schema.with_metadata(incarnation_metadata("crashed"))
    lance.write_dataset(
        pa.Table.from_batches([kit.make_batch(4)], schema=stray), location, mode="create"
    )
    record = await coordinator.create_table(kit.episodes, kit.schema)
    dataset = lance.dataset(location)
    assert dataset.count_rows() == 0
    assert incarnation_of(dataset.schema.metadata) == record.incarnation
    assert await append(coordinator, kit, 2, start=0) == 1


@pytest.mark.asyncio
async def test_drop_and_recreate_gets_a_new_incarnation(
    coordinator: CommitCoordinator, kit: Any
) -> None:
    first = await coordinator.create_table(kit.episodes, kit.schema)
    await append(coordinator, kit, 2, start=0)
    dropped = await coordinator.drop_table(kit.episodes)
    assert dropped.dropped_version == 1
    second = await coordinator.create_table(kit.episodes, kit.schema)
    assert second.incarnation != first.incarnation
    assert second.location == first.location
    assert lance.dataset(second.location).count_rows() == 0
    marker = coordinator.sidecars.root / first.incarnation / "dropped.json"
    assert marker.exists()


@pytest.mark.asyncio
async def test_retention_catches_up_once_a_stream_of_appends_drains(
    make_coordinator: Any, kit: Any
) -> None:
    # While appends queue up, retention is deferred (at most once a second);
    # the group that empties the queue must still apply it before replying.
    coord = make_coordinator(retain_versions=2, retain_min_age_secs=0)
    await coord.open()
    try:
        record = await coord.create_table(kit.episodes, kit.schema)

        async def writer(w: int) -> list[int]:
            return [await append(coord, kit, 1, start=100 * w + i) for i in range(6)]

        versions = {v for vs in await asyncio.gather(*(writer(w) for w in range(8))) for v in vs}
        current = await coord.describe_table(kit.episodes)
        # Concurrent appends share versions (commit groups), without gaps.
        assert versions == set(range(1, current.version + 1))
        kept = sorted(v["version"] for v in lance.dataset(record.location).versions())
        assert kept == [current.engine_version - 1, current.engine_version]
    finally:
        await coord.close()


def lance_versions(location: str) -> list[int]:
    return sorted(v["version"] for v in lance.dataset(location).versions())


@pytest.mark.asyncio
async def test_age_floor_keeps_replaced_versions_until_they_are_old(
    make_coordinator: Any, kit: Any
) -> None:
    # Count window 2, age floor 60 s: six appends in a second reclaim nothing;
    # an hour later (the engine's clock moved) the count window alone decides.
    coord = make_coordinator(retain_versions=2, retain_min_age_secs=60)
    await coord.open()
    try:
        record = await coord.create_table(kit.episodes, kit.schema)
        await append(coord, kit, 1, start=0)
        tagged = (await coord.describe_table(kit.episodes)).engine_version
        lance.dataset(record.location).tags.create("keep", tagged)
        for i in range(1, 6):
            await append(coord, kit, 1, start=i)
        current = await coord.describe_table(kit.episodes)
        every = list(range(record.engine_version, current.engine_version + 1))
        assert lance_versions(record.location) == every
        assert (
            await asyncio.to_thread(
                coord.engine.cleanup_now, record.location, current.engine_version
            )
            == 0
        )
        real = coord.engine.clock
        coord.engine.clock = lambda: real() + 3600
        removed = await asyncio.to_thread(
            coord.engine.cleanup_now, record.location, current.engine_version
        )
        kept = sorted({tagged, current.engine_version - 1, current.engine_version})
        assert removed == len(every) - len(kept)
        assert lance_versions(record.location) == kept
        # Every retained version still reads whole: no data file of theirs went.
        for version in kept:
            table = await coord.engine.read(record.location, version)
            assert table.num_rows == version - record.engine_version
        with pytest.raises(VersionReclaimed):
            await coord.engine.read(record.location, record.engine_version)
    finally:
        await coord.close()


@pytest.mark.asyncio
async def test_age_counts_from_when_a_version_was_replaced(make_coordinator: Any, kit: Any) -> None:
    # A version committed long ago but replaced only now is still some
    # ticket's head: it stays for the age floor. Lance's own ``older_than``
    # (the version's own commit time) would reclaim it.
    coord = make_coordinator(retain_versions=1, retain_min_age_secs=60)
    await coord.open()
    try:
        record = await coord.create_table(kit.episodes, kit.schema)
        for i in range(3):
            await append(coord, kit, 1, start=i)
        head = (await coord.describe_table(kit.episodes)).engine_version
        stamp = lance.dataset(record.location).get_version()["timestamp"].timestamp()
        # The next commit is stamped strictly later than the boundary below.
        await asyncio.sleep(max(0.0, stamp + 0.02 - time.time()))
        boundary = time.time()
        for i in range(3, 5):
            await append(coord, kit, 1, start=i)
        current = (await coord.describe_table(kit.episodes)).engine_version
        # As if the first three appends were committed over a minute ago and the
        # last two just now.
        coord.engine.clock = lambda: boundary + 60
        await asyncio.to_thread(coord.engine.cleanup_now, record.location, current)
        assert lance_versions(record.location) == [head, current - 1, current]
        assert (await coord.engine.read(record.location, head)).num_rows == 3
        with pytest.raises(VersionReclaimed):
            await coord.engine.read(record.location, head - 1)
    finally:
        await coord.close()


@pytest.mark.asyncio
async def test_age_floor_survives_a_compaction(make_coordinator: Any, kit: Any) -> None:
    # The maintenance compactor commits a new Lance version and runs the same
    # retention: the version before it stays readable for the age floor.
    from lake_metasrv.maintenance import Maintenance

    coord = make_coordinator(retain_versions=1, retain_min_age_secs=60)
    await coord.open()
    try:
        record = await coord.create_table(kit.episodes, kit.schema)
        for i in range(4):
            await append(coord, kit, 1, start=i)
        before = (await coord.describe_table(kit.episodes)).engine_version
        result = await Maintenance(coord).compact(kit.episodes)
        assert result.changed
        assert result.fragments_after < result.fragments_before
        after = (await coord.describe_table(kit.episodes)).engine_version
        assert after > before
        assert (await coord.engine.read(record.location, before)).num_rows == 4
        assert before in lance_versions(record.location)
    finally:
        await coord.close()


@pytest.mark.asyncio
async def test_age_floor_retention_stays_bounded_under_steady_appends(
    make_coordinator: Any, kit: Any
) -> None:
    # A floor of 1 s (the smallest useful one) under ~3 s of appends: what is
    # kept is the count window plus what was replaced within about the floor
    # (plus one pass interval), never the whole history.
    coord = make_coordinator(retain_versions=2, retain_min_age_secs=1)
    await coord.open()
    try:
        record = await coord.create_table(kit.episodes, kit.schema)
        committed: list[float] = []
        began = time.monotonic()
        i = 0
        while time.monotonic() - began < 3.0 or len(committed) < 20:
            await append(coord, kit, 1, start=i)
            committed.append(time.time())
            i += 1
        kept = lance_versions(record.location)
        recent = sum(1 for t in committed if t >= time.time() - 1.5)
        assert len(kept) <= recent + 3, (len(kept), recent, len(committed))
        assert len(kept) < len(committed)
        current = (await coord.describe_table(kit.episodes)).engine_version
        for version in kept:  # every retained version reads whole
            table = await coord.engine.read(record.location, version)
            assert table.num_rows == version - record.engine_version
        assert kept[-1] == current
    finally:
        await coord.close()
