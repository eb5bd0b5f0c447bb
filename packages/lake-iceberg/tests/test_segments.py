"""The segment catalog and finalized segments, without a network."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from lake_iceberg.errors import SegmentCatalogError
from lake_iceberg.registrar.segments import (
    CATALOG_FILE,
    SCHEMA_VERSION,
    SegmentCatalog,
    Uploaded,
    finalized_segments,
    write_segment,
)

SCHEMA = pa.schema([pa.field("id", pa.int64(), metadata={"PARQUET:field_id": "1"})])


def entry(key: str = "p/lake/v1/e/ds/1.parquet", sha: str = "ab" * 32) -> Uploaded:
    return Uploaded(
        bucket="b",
        object_key=key,
        pipeline="e",
        dataset="ds",
        segment="1.parquet",
        size=10,
        sha256=sha,
    )


def test_record_is_idempotent_and_durable(tmp_path: Path) -> None:
    with SegmentCatalog(tmp_path) as catalog:
        assert catalog.record(entry()) is True
        assert catalog.record(entry()) is False
        with pytest.raises(SegmentCatalogError, match="immutable"):
            catalog.record(entry(sha="cd" * 32))
    with SegmentCatalog(tmp_path, create=False) as reopened:
        [only] = reopened.entries("e")
        assert only.object_key == "p/lake/v1/e/ds/1.parquet"
        assert only.seq == 1
        assert reopened.entries("other") == []
    db = sqlite3.connect(tmp_path / CATALOG_FILE)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_missing_catalog_is_an_error_for_readers(tmp_path: Path) -> None:
    with pytest.raises(SegmentCatalogError, match="no segment catalog"):
        SegmentCatalog(tmp_path, create=False)


def test_only_finalized_segments_are_listed(tmp_path: Path) -> None:
    write_segment(tmp_path, "ds", "000002", pa.table({"id": [2]}, schema=SCHEMA))
    write_segment(tmp_path, "ds", "000001", pa.table({"id": [1]}, schema=SCHEMA))
    (tmp_path / "ds" / ".000003.parquet.partial").write_bytes(b"PAR1")
    (tmp_path / "_internal").mkdir()
    (tmp_path / "_internal" / "x.parquet").write_bytes(b"PAR1")
    listed = [(d, p.name) for d, p in finalized_segments(tmp_path)]
    assert listed == [("ds", "000001.parquet"), ("ds", "000002.parquet")]


def test_segments_need_field_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="field id"):
        write_segment(tmp_path, "ds", "000001", pa.table({"id": [1]}))


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data


class _FakeS3:
    """Serves ranged GETs of one object, and counts them."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.ranges: list[str] = []

    def get_object(self, Bucket: str, Key: str, Range: str) -> dict[str, object]:
        self.ranges.append(Range)
        start, end = (int(x) for x in Range.removeprefix("bytes=").split("-"))
        return {
            "Body": _Body(self.data[start : end + 1]),
            "ContentRange": f"bytes {start}-{end}/{len(self.data)}",
        }


def test_footer_takes_two_ranged_reads_and_refuses_huge_footers(tmp_path: Path) -> None:
    import struct

    from lake_iceberg.registrar.footer import MAX_FOOTER_BYTES, read_footer

    path = write_segment(tmp_path, "ds", "000001", pa.table({"id": [1, 2]}, schema=SCHEMA))
    data = path.read_bytes()
    s3 = _FakeS3(data)
    footer = read_footer(s3, entry_for(data))
    assert footer.num_rows == 2
    assert len(s3.ranges) == 2

    huge = b"PAR1" + b"\0" * 16 + struct.pack("<I", MAX_FOOTER_BYTES + 1) + b"PAR1"
    s3 = _FakeS3(huge)
    with pytest.raises(SegmentCatalogError, match="over the"):
        read_footer(s3, entry_for(huge))
    assert len(s3.ranges) == 1

    with pytest.raises(SegmentCatalogError, match="not the 999 bytes"):
        read_footer(_FakeS3(data), entry_for(data, size=999))


def entry_for(data: bytes, size: int | None = None) -> Uploaded:
    return Uploaded(
        bucket="b",
        object_key="k",
        pipeline="e",
        dataset="ds",
        segment="1.parquet",
        size=len(data) if size is None else size,
        sha256="00" * 32,
    )
