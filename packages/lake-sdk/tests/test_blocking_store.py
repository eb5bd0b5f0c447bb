"""The blocking ObjectStore over a local stage: its reads are the async store's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lake_objects import FileUpload, InvalidRange, LocationOutsideStage, StageSettings, open_store
from lake_sdk import ObjectStore
from lake_sdk._background_loop import BackgroundLoop


def test_map_range_is_open_range_without_a_copy(tmp_path: Path) -> None:
    store = ObjectStore(
        BackgroundLoop.shared(),
        open_store(StageSettings.local(tmp_path / "objects").descriptor("acme")),
    )
    try:
        data = os.urandom(3 * 1024 * 1024 + 5)
        source = tmp_path / "clip.mp4"
        source.write_bytes(data)
        location = store.upload(FileUpload.from_path(source, "video/mp4"))
        for start, end in [(0, len(data)), (4095, 4097), (len(data) - 1, len(data))]:
            view = store.map_range(location, start, end)
            assert view is not None
            assert view.readonly
            with store.open_range(location, start, end) as reader:
                assert bytes(view) == reader.read() == data[start:end]
        with pytest.raises(InvalidRange):
            store.map_range(location, 2, 1)
        foreign = location.model_copy(update={"uri": location.uri.replace("/acme/", "/globex/")})
        with pytest.raises(LocationOutsideStage):
            store.map_range(foreign, 0, 1)
    finally:
        store.close()
