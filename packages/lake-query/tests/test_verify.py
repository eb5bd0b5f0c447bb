"""DataFileVerifier: every data file checked once, before rows are served; failures rechecked."""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lake_core.errors import ConfigError, DataCorrupted
from lake_core.integrity import DataFileDigest, digest_file, fragment_file_paths
from lake_core.models import TableDescriptor
from lake_core.names import TableRef
from lake_query.verify import VERIFY_ON_OPEN, DataFileVerifier, verify_on_open

TABLE = TableRef("ns", "t")


def dataset(tmp_path: Path, appends: int = 2) -> tuple[str, dict[str, DataFileDigest]]:
    uri = str(tmp_path / "t.lance")
    for i in range(appends):
        lance.write_dataset(
            pa.table({"id": list(range(i * 100, (i + 1) * 100))}),
            uri,
            mode="append" if i else "create",
        )
    digests = {}
    for path in fragment_file_paths(lance.dataset(uri).get_fragments()):
        size, sha = digest_file(Path(uri) / "data" / path)
        digests[path] = DataFileDigest(path=path, size_bytes=size, sha256=sha)
    return uri, digests


def descriptor(uri: str, version: int) -> TableDescriptor:
    return TableDescriptor(location=uri, incarnation="i1", version=version, engine_version=version)


def test_files_are_read_once_and_a_corrupt_one_is_refused_every_time(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path)
    fetches: list[TableRef] = []

    def source(table: TableRef) -> dict[str, DataFileDigest]:
        fetches.append(table)
        return digests

    verifier = DataFileVerifier(source)
    first = lance.dataset(uri, version=1)
    verifier.check(first, TABLE, descriptor(uri, 1))
    # Version 2 adds one file: only that one is new; version 1's file is not read again.
    second_path = sorted(set(digests) - set(fragment_file_paths(first.get_fragments())))[0]
    data = Path(uri) / "data"
    raw = (data / second_path).read_bytes()
    (data / second_path).write_bytes(raw[:10] + bytes([raw[10] ^ 0xFF]) + raw[11:])
    for _ in range(2):
        with pytest.raises(DataCorrupted, match=r"^lake\.ns\.t version 2: ") as caught:
            verifier.check(lance.dataset(uri, version=2), TABLE, descriptor(uri, 2))
        assert uri not in str(caught.value)
    (data / second_path).write_bytes(raw)
    verifier.check(lance.dataset(uri, version=2), TABLE, descriptor(uri, 2))
    # Verified files are remembered: corrupting one now goes unnoticed (documented:
    # data files are immutable), and nothing is fetched or read again.
    calls = len(fetches)
    (data / second_path).write_bytes(b"garbage")
    verifier.check(lance.dataset(uri, version=2), TABLE, descriptor(uri, 2))
    assert len(fetches) == calls


def test_memory_is_bounded(tmp_path: Path) -> None:
    uri, digests = dataset(tmp_path, appends=3)
    verifier = DataFileVerifier(lambda table: digests, capacity=2)
    for version in (1, 2, 3):
        verifier.check(lance.dataset(uri, version=version), TABLE, descriptor(uri, version))
    assert len(verifier._files._keys) == 2
    assert len(verifier._versions._keys) == 2


def test_the_setting_is_validated() -> None:
    assert verify_on_open({}) is False
    assert verify_on_open({VERIFY_ON_OPEN: "true"}) is True
    assert verify_on_open({VERIFY_ON_OPEN: "0"}) is False
    with pytest.raises(ConfigError, match=VERIFY_ON_OPEN):
        verify_on_open({VERIFY_ON_OPEN: "yes please"})
