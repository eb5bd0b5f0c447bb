"""The blocking client's FILE methods against a real Lake (local stage), as users write them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import lake_sdk
from tests.files.conftest import INSERT, MIB, write_random
from tools.lake_testing.plugin import LakeCluster


def test_sync_client_inserts_reads_and_shares_its_stage_with_clones(
    local_lake: LakeCluster, tmp_path: Path
) -> None:
    video = write_random(tmp_path / "a.mp4", MIB + 3, seed=4)
    with lake_sdk.Client(local_lake.query.url, upload_checkpoint_dir=tmp_path / "ck") as client:
        version = client.insert_many(
            INSERT, [["a", lake_sdk.FileUpload.from_path(video, "video/mp4")]]
        )
        assert version == 1
        result = client.query("SELECT episode_id, video FROM robots.episodes")
        assert result.schema.names == ["episode_id", "video"]
        table = result.to_table()
        location = lake_sdk.data_location(table, "video", 0)
        with client.open(location) as reader:
            assert hashlib.sha256(reader.read()).hexdigest() == location.sha256
            assert reader.verified
        clone = client.clone()
        store = clone.object_store()
        assert store.descriptor == client.object_store().descriptor
        with store.open_range(location, 1, 11) as part:
            assert part.read() == video.read_bytes()[1:11]
        assert clone.cancel_upload(video) is False  # nothing checkpointed: it completed
        assert clone.pending_append_ids() == []
        batches = list(client.query("SELECT count(*) AS n FROM robots.episodes"))
        assert batches[0].column("n")[0].as_py() == 1


def test_sync_query_only_client_has_no_stage(local_lake: LakeCluster) -> None:
    with lake_sdk.Client(local_lake.query.url, query_only=True) as client:
        with pytest.raises(lake_sdk.StageUnavailable, match="query-only"):
            client.object_store()
        with pytest.raises(lake_sdk.TableNotFound):
            client.table_schema("robots.nothing_here")
