"""ManifestBytes (by path and recorded length, bounded in bytes and per file) and
ManifestLists (by path, bounded by manifests listed)."""

from __future__ import annotations

from pyiceberg.manifest import ManifestFile

from lake_iceberg.federation.contents import ManifestBytes, ManifestLists


def test_bytes_are_found_by_path_and_recorded_length() -> None:
    kept = ManifestBytes(capacity=100, max_file=50)
    kept.put("s3://b/m1.avro", 3, b"abc")
    assert kept.get("s3://b/m1.avro", 3) == b"abc"
    assert kept.get("s3://b/m1.avro", 4) is None  # another recorded length: another file
    assert kept.get("s3://b/m2.avro", 3) is None


def test_a_read_of_another_length_than_recorded_is_not_kept() -> None:
    kept = ManifestBytes(capacity=100, max_file=50)
    kept.put("s3://b/m1.avro", 4, b"abc")
    assert kept.get("s3://b/m1.avro", 4) is None
    assert kept.get("s3://b/m1.avro", 3) is None
    assert len(kept) == 0
    assert kept.nbytes == 0


def test_a_file_larger_than_the_per_file_bound_is_not_kept() -> None:
    kept = ManifestBytes(capacity=100, max_file=5)
    kept.put("s3://b/big.avro", 6, b"x" * 6)
    kept.put("s3://b/small.avro", 5, b"x" * 5)
    assert kept.get("s3://b/big.avro", 6) is None
    assert kept.get("s3://b/small.avro", 5) == b"x" * 5


def test_the_least_recently_used_go_first_and_the_total_stays_bounded() -> None:
    kept = ManifestBytes(capacity=10, max_file=10)
    kept.put("a", 4, b"aaaa")
    kept.put("b", 4, b"bbbb")
    assert kept.get("a", 4) == b"aaaa"  # now the most recently used
    kept.put("c", 4, b"cccc")  # 12 > 10: "b" goes
    assert kept.get("b", 4) is None
    assert kept.get("a", 4) == b"aaaa"
    assert kept.get("c", 4) == b"cccc"
    assert kept.nbytes == 8 <= kept.capacity
    kept.put("a", 4, b"aaaa")  # kept already: counted once
    assert kept.nbytes == 8
    assert len(kept) == 2


def _listed(count: int) -> list[ManifestFile]:
    return [
        ManifestFile.from_args(
            manifest_path=f"s3://b/m{i}.avro", manifest_length=10, partition_spec_id=0
        )
        for i in range(count)
    ]


def test_manifest_lists_are_kept_by_path_and_bounded_by_manifests_listed() -> None:
    lists = ManifestLists(capacity=5)
    lists.put("s3://b/snap-1.avro", _listed(2))
    lists.put("s3://b/snap-2.avro", _listed(3))
    first = lists.get("s3://b/snap-1.avro")
    assert first is not None
    assert [m.manifest_path for m in first] == ["s3://b/m0.avro", "s3://b/m1.avro"]
    lists.put("s3://b/snap-3.avro", _listed(1))  # 6 > 5 listed: snap-2 goes (least recent)
    assert lists.get("s3://b/snap-2.avro") is None
    assert lists.get("s3://b/snap-3.avro") is not None
    lists.put("s3://b/huge.avro", _listed(6))  # longer than the whole bound: not kept
    assert lists.get("s3://b/huge.avro") is None
    assert len(lists) == 2
