"""StorageProbe answers from the store, in types: present, absent, unreachable."""

from __future__ import annotations

import socket
from pathlib import Path

from lake_core.cloud import DatasetStorage
from lake_core.storage_probe import StorageProbe


def test_version_exists_follows_the_manifest_files(tmp_path: Path) -> None:
    # Lance's two manifest namings (lake-core does not depend on Lance itself).
    versions = tmp_path / "t.lance" / "_versions"
    versions.mkdir(parents=True)
    (versions / "1.manifest").write_bytes(b"")
    (versions / f"{2**64 - 1 - 2:020d}.manifest").write_bytes(b"")
    location = str(tmp_path / "t.lance")
    probe = StorageProbe(DatasetStorage())
    assert probe.version_exists(location, 1)
    assert probe.version_exists(location, 2)
    assert not probe.version_exists(location, 3)
    assert probe.reachable(location)


def test_an_unreachable_s3_endpoint_is_not_reachable() -> None:
    # A port nothing listens on: the connection is refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    storage = DatasetStorage(
        region="us-east-1", s3_endpoint=f"http://127.0.0.1:{port}", timeout_ms=500
    )
    assert not StorageProbe(storage).reachable("s3://bucket/ns/t.lance")
