"""FILE values on the local stage (Metasrv's data directory), through real processes."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

import lake_sdk
from lake_core.errors import InvalidArgument, PermissionDenied
from lake_core.filetype import FILE_STRUCT
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects import (
    EPISODE_ARTIFACT_SCHEMA_V1,
    EpisodeBundle,
    FileUpload,
    HashMismatch,
    InvalidRange,
    LocationOutsideStage,
    ObjectOverlong,
    PrematureEof,
    PresignUnsupported,
    episode_artifact_table_v1,
)
from lake_sdk import LakeClient
from tests.files.conftest import EPISODES, INSERT, MIB, write_random
from tools.lake_testing.data import create_table, describe_version
from tools.lake_testing.plugin import LakeCluster

pytestmark = [pytest.mark.asyncio]


def _objects(cluster: LakeCluster) -> list[Path]:
    root = cluster.root / "data" / "objects"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


async def test_insert_query_and_read_back_verified(local_lake: LakeCluster, tmp_path: Path) -> None:
    a = write_random(tmp_path / "a.mp4", 3 * MIB + 5, seed=1)
    b = write_random(tmp_path / "b.bin", 17, seed=2)
    async with await LakeClient.connect(local_lake.query.url) as client:
        version = await client.insert_many(
            INSERT,
            [
                ["ep-1", FileUpload.from_path(a, "video/mp4")],
                ["ep-2", FileUpload.from_path(b, "application/octet-stream")],
                ["ep-3", None],
            ],
        )
        assert version == 1
        table = await client.query_table("SELECT * FROM robots.episodes ORDER BY episode_id")
        assert table.num_rows == 3
        for row, source in enumerate((a, b)):
            location = lake_sdk.data_location(table, "video", row)
            assert location.uri.startswith("file://" + str(local_lake.root / "data" / "objects"))
            assert "/tenants/local/" in location.uri
            assert location.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
            reader = await client.open(location)
            chunks = [chunk async for chunk in reader]
            assert b"".join(chunks) == source.read_bytes()
            assert reader.verified
        location = lake_sdk.data_location(table, "video", 0)
        assert (
            await (await client.open_range(location, MIB, MIB + 10)).read()
            == a.read_bytes()[MIB : MIB + 10]
        )
        for start, end in [(3, 3), (4, 2), (0, location.size_bytes + 1)]:
            with pytest.raises(InvalidRange):
                await client.open_range(location, start, end)
        with pytest.raises(PresignUnsupported):
            await client.presign_read(location, 60)
        with pytest.raises(PresignUnsupported):  # Query signs only for an S3 stage
            await client.open_via_query(location, 60)
    assert await asyncio.to_thread(describe_version, local_lake.meta.addr, EPISODES) == 1


async def test_every_row_is_validated_before_the_first_upload(
    local_lake: LakeCluster, tmp_path: Path
) -> None:
    good = write_random(tmp_path / "good.bin", 1000)
    upload = FileUpload.from_path(good, "video/mp4")
    bad_batches = [
        ("INSERT INTO robots.episodes (episode_id, video) VALUES (?, ?)", []),
        (
            "INSERT INTO robots.episodes (episode_id, video) VALUES (?, ?)",
            [["ep", upload]] * 10_001,
        ),
        ("INSERT INTO robots.episodes (episode_id, nope) VALUES (?, ?)", [["ep", upload]]),
        ("INSERT INTO robots.episodes (episode_id, video) VALUES (?, 'x')", [["ep", upload]]),
        ("DELETE FROM robots.episodes", [["ep", upload]]),
        (INSERT, [["ep-1", upload], ["ep-2", "not a file"]]),
        (INSERT, [["ep-1", upload], [42, upload]]),
        (INSERT, [["ep-1", upload], ["ep-2"]]),
        (
            INSERT,
            [["ep-1", upload], ["ep-2", FileUpload.from_path(tmp_path / "missing", "video/mp4")]],
        ),
    ]
    async with await LakeClient.connect(local_lake.query.url) as client:
        for sql, rows in bad_batches:
            with pytest.raises(InvalidArgument):
                await client.insert_many(sql, rows)
        with pytest.raises(InvalidArgument):
            FileUpload.from_path(good, "not a media type")
        stream = FileUpload.from_reader(io.BytesIO(good.read_bytes()), "video/mp4")
        with pytest.raises(InvalidArgument):
            await client.insert_many(INSERT, [["a", stream], ["b", stream]])
    assert _objects(local_lake) == []
    assert await asyncio.to_thread(describe_version, local_lake.meta.addr, EPISODES) == 0


async def test_corrupted_local_objects_fail_open(local_lake: LakeCluster, tmp_path: Path) -> None:
    source = write_random(tmp_path / "v.bin", 2 * MIB)
    async with await LakeClient.connect(local_lake.query.url) as client:
        await client.insert(INSERT, ["ep", FileUpload.from_path(source, "video/mp4")])
        table = await client.query_table("SELECT video FROM robots.episodes")
        location = lake_sdk.data_location(table, "video", 0)
        path = Path(location.uri.removeprefix("file://"))
        data = await asyncio.to_thread(path.read_bytes)
        flipped = bytearray(data)
        flipped[12345] ^= 0x80
        for body, error in (
            (bytes(flipped), HashMismatch),
            (data[:-1], PrematureEof),
            (data + b"\0", ObjectOverlong),
        ):
            await asyncio.to_thread(path.write_bytes, body)
            with pytest.raises(error):
                await (await client.open(location)).read()


async def test_stage_discovered_once_and_shared_by_clones(
    local_lake: LakeCluster, tmp_path: Path
) -> None:
    source = write_random(tmp_path / "v.bin", 100)
    async with await LakeClient.connect(local_lake.query.url) as client:
        clone = client.clone()
        await asyncio.gather(
            client.insert(INSERT, ["a", FileUpload.from_path(source, "video/mp4")]),
            clone.insert(INSERT, ["b", FileUpload.from_path(source, "video/mp4")]),
        )
        await client.insert(INSERT, ["c", FileUpload.from_path(source, "video/mp4")])
        assert client._state.files.discoveries == 1
        assert client._state.schemas.lookups == 1  # single flight, shared
        clone.invalidate_table_schema(EPISODES)
        await client.table_schema(EPISODES)
        assert client._state.schemas.lookups == 2
    query_only = await LakeClient.connect_query_only(local_lake.query.url)
    with pytest.raises(lake_sdk.StageUnavailable, match="query-only"):
        await query_only.object_store()
    await query_only.close()


ESCAPES = [
    "file://{root}/tenants/other/objects/x",
    "file://{root}/tenants/local/../other/objects/x",
    "file://{root}/tenants/local/objects/%2e%2e/%2e%2e/x",
    "file://{root}/tenants/local/objects/.hidden",
    "file:///etc/passwd",
    "file://{root}/../tenants/local/x",
    "s3://bucket/tenants/local/objects/x",
]


async def test_tenant_escapes_refused_by_sdk_query_and_metasrv(local_lake: LakeCluster) -> None:
    from lake_core.ids import new_operation_id
    from lake_core.metaclient import MetaClient
    from lake_core.protocol import AppendCommand

    root = local_lake.root / "data" / "objects"
    async with await LakeClient.connect(local_lake.query.url) as client:
        schema = await client.table_schema(EPISODES)
        for uri in ESCAPES:
            location = DataLocation(
                uri=uri.format(root=root), media_type="video/mp4", size_bytes=4, sha256="cd" * 32
            )
            with pytest.raises(LocationOutsideStage):
                await client.open(location)
            with pytest.raises(LocationOutsideStage):
                await client.insert(INSERT, ["x", location])
            batch = pa.RecordBatch.from_arrays(
                [pa.array(["x"]), pa.array([location.model_dump()], FILE_STRUCT)], schema=schema
            )
            with pytest.raises(PermissionDenied):  # Query
                await client.append_batches(EPISODES, [batch])
            async with MetaClient(f"http://{local_lake.meta.addr}") as meta:
                with pytest.raises(PermissionDenied):  # Metasrv, bypassing Query
                    await meta.append(
                        AppendCommand(table=EPISODES, operation_id=new_operation_id()),
                        schema,
                        [batch],
                    )
    assert await asyncio.to_thread(describe_version, local_lake.meta.addr, EPISODES) == 0


async def test_episode_bundle_appended_by_a_query_only_client(
    lake_cluster: LakeCluster, tmp_path: Path
) -> None:
    table = TableRef("robots", "bundles")
    await asyncio.to_thread(create_table, lake_cluster.meta.addr, table, EPISODE_ARTIFACT_SCHEMA_V1)
    await asyncio.to_thread(
        create_table, lake_cluster.meta.addr, EPISODES, pa.schema([("episode_id", pa.utf8())])
    )
    video = write_random(tmp_path / "cam.mp4", 4096)
    async with await LakeClient.connect(lake_cluster.query.url) as uploader:
        store = await uploader.object_store()
        location = await store.upload(FileUpload.from_path(video, "video/mp4"))
    start = datetime(2026, 11, 1, 12, tzinfo=UTC)
    bundle = EpisodeBundle(
        episode_id="ep-7",
        robot_id="arm-2",
        started_at=start,
        ended_at=start + timedelta(seconds=90),
        video=location,
    )
    batch = episode_artifact_table_v1([bundle])
    async with await LakeClient.connect_query_only(lake_cluster.query.url) as client:
        assert await client.append_batches(table, [batch]) == 1
        rows = await client.query_table("SELECT episode_id, robot_id, video FROM robots.bundles")
        assert lake_sdk.data_location(rows, "video", 0) == location
    with pytest.raises(ValueError, match="end before"):
        EpisodeBundle(episode_id="e", robot_id="r", started_at=start, ended_at=start - timedelta(1))


async def test_checkpointed_inserts_leave_no_pending_append(
    local_lake: LakeCluster, tmp_path: Path
) -> None:
    source = write_random(tmp_path / "v.bin", 1000)
    async with await LakeClient.connect(
        local_lake.query.url, upload_checkpoint_dir=tmp_path / "ck"
    ) as client:
        await client.insert(INSERT, ["a", FileUpload.from_path(source, "video/mp4")])
        assert await client.pending_append_ids() == []
        assert os.listdir(tmp_path / "ck" / "appends") == []
