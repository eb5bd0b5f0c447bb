"""The INSERT binder and the pending-append store."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from lake_core.errors import InvalidArgument, NotFound
from lake_core.filetype import file_field
from lake_core.ids import new_operation_id
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_objects import FileUpload
from lake_sdk._inserts import parse_insert, plan_insert
from lake_sdk._pending import MAX_PENDING_ENTRIES, PendingAppendDamaged, PendingAppendStore

SCHEMA = pa.schema(
    [pa.field("id", pa.utf8(), nullable=False), pa.field("n", pa.int64()), file_field("video")]
)


def test_parse_insert() -> None:
    statement = parse_insert('insert into lake.robots.eps ("id", video)\nVALUES (?, ?);')
    assert statement.table == TableRef("robots", "eps")
    assert statement.columns == ("id", "video")
    for bad in (
        "SELECT 1",
        "INSERT INTO t (a) VALUES (?)",
        "INSERT INTO n.t (a, a) VALUES (?, ?)",
        "INSERT INTO n.t (a, b) VALUES (?)",
        "INSERT INTO n.t (a) VALUES (1)",
        "INSERT INTO n.t (a) VALUES (?); DROP TABLE x",
    ):
        with pytest.raises(InvalidArgument):
            parse_insert(bad)


def test_plan_builds_one_exact_batch(tmp_path: Path) -> None:
    source = tmp_path / "v.bin"
    source.write_bytes(b"abc")
    upload = FileUpload.from_path(source, "video/mp4")
    existing = DataLocation(uri="s3://b/x", media_type="a/b", size_bytes=1, sha256="a" * 64)
    plan = plan_insert(
        parse_insert("INSERT INTO r.e (id, video) VALUES (?, ?)"),
        SCHEMA,
        [["a", upload], ["b", existing], ["c", None]],
    )
    assert [(c, r) for c, r, _ in plan.uploads] == [("video", 0)]
    uploaded = DataLocation(uri="s3://b/y", media_type="video/mp4", size_bytes=3, sha256="b" * 64)
    batch = plan.build({("video", 0): uploaded})
    assert batch.schema.equals(SCHEMA, check_metadata=True)
    assert batch.column("n").null_count == 3
    assert batch.column("video").to_pylist()[0]["uri"] == "s3://b/y"


def test_plan_refuses_bad_rows() -> None:
    statement = parse_insert("INSERT INTO r.e (id, n) VALUES (?, ?)")
    for rows in ([], [["a", 1]] * 10_001, [["a", "x"]], [[None, 1]], [["a"]], "ab"):
        with pytest.raises(InvalidArgument):
            plan_insert(statement, SCHEMA, rows)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not nullable"):
        plan_insert(parse_insert("INSERT INTO r.e (n) VALUES (?)"), SCHEMA, [[1]])
    with pytest.raises(InvalidArgument, match="MiB"):
        plan_insert(statement, SCHEMA, [["x" * (17 * 1024 * 1024), 1]])


def test_pending_store_round_trip_damage_and_cap(tmp_path: Path) -> None:
    store = PendingAppendStore(tmp_path)
    schema = pa.schema([("a", pa.int64())])
    batch = pa.RecordBatch.from_pydict({"a": [1, 2]}, schema=schema)
    op = new_operation_id()
    path = store.write(op, TableRef("n", "t"), schema, [batch])
    assert store.ids() == [op]
    loaded = store.load(op)
    assert loaded.table == TableRef("n", "t")
    assert loaded.batches[0].equals(batch)
    raw = path.read_bytes()
    path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(PendingAppendDamaged):
        store.load(op)
    path.write_bytes(raw[:-5])
    with pytest.raises(PendingAppendDamaged):
        store.load(op)
    store.remove(op)
    with pytest.raises(NotFound):
        store.load(op)
    for _ in range(MAX_PENDING_ENTRIES + 50):
        (store.directory / f"{new_operation_id()}.pending").write_bytes(b"")
    assert len(store.ids()) <= MAX_PENDING_ENTRIES
    assert len(os.listdir(store.directory)) == MAX_PENDING_ENTRIES + 50
