"""FileIOs: one FileIO per distinct property set and scheme, reused, bounded."""

from __future__ import annotations

from lake_iceberg.federation.fileios import FileIOs


def test_the_same_properties_reuse_one_file_io_and_others_get_their_own() -> None:
    ios = FileIOs(capacity=2)
    props = {"s3.endpoint": "http://127.0.0.1:1", "s3.region": "us-east-1"}
    first = ios.get(props, "s3://bucket/t/metadata/v1.json")
    assert ios.get(dict(reversed(list(props.items()))), "s3://bucket/t/metadata/v2.json") is first
    other = ios.get({**props, "s3.access-key-id": "rotated"}, "s3://bucket/t/metadata/v2.json")
    assert other is not first
    assert other.properties["s3.access-key-id"] == "rotated"


def test_the_least_recently_used_file_io_goes_first() -> None:
    ios = FileIOs(capacity=2)
    a = ios.get({"k": "a"}, "file:///tmp/a")
    b = ios.get({"k": "b"}, "file:///tmp/b")
    assert ios.get({"k": "a"}, "file:///tmp/a") is a
    ios.get({"k": "c"}, "file:///tmp/c")  # b goes
    assert len(ios) == 2
    assert ios.get({"k": "a"}, "file:///tmp/a") is a
    assert ios.get({"k": "b"}, "file:///tmp/b") is not b
