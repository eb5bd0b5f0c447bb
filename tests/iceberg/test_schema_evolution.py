"""Schema evolution by field id, end to end, and the fatal cases that leave the table untouched."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lake_iceberg.errors import ConfigInvalid, IcebergSchemaMismatch, IcebergUnsupportedType
from lake_iceberg.registrar.service import Registrar
from tests.iceberg.conftest import Lane, data_files, field

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

V1 = pa.schema([field("robot", pa.string(), 1), field("speed", pa.int32(), 2)])
# int -> long, and a new column with its own id.
V2 = pa.schema(
    [field("robot", pa.string(), 1), field("speed", pa.int64(), 2), field("temp", pa.float64(), 5)]
)
# A rename: the id decides.
V3 = pa.schema(
    [
        field("robot", pa.string(), 1),
        field("velocity", pa.int64(), 2),
        field("temp", pa.float64(), 5),
    ]
)
# Narrowing back to int.
V4 = pa.schema(
    [
        field("robot", pa.string(), 1),
        field("velocity", pa.int32(), 2),
        field("temp", pa.float32(), 5),
    ]
)


def test_int_to_long_new_column_then_rename_then_narrowing_is_fatal(lane: Lane) -> None:
    lane.write("pose", "000001", V1, {"robot": ["a", "b"], "speed": [1, 2**31 - 1]})
    lane.ship()
    registrar = Registrar(lane.config())
    assert registrar.run_once().registered == 1

    lane.write("pose", "000002", V2, {"robot": ["c"], "speed": [2**40], "temp": [21.5]})
    lane.write("pose", "000003", V3, {"robot": ["d"], "velocity": [7], "temp": [22.0]})
    lane.ship()
    assert registrar.run_once().registered == 2

    table = lane.table("pose")
    fields = [(f.field_id, f.name, str(f.field_type)) for f in table.schema().fields]
    assert fields == [(1, "robot", "string"), (2, "velocity", "long"), (5, "temp", "double")]
    rows = {r["robot"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows["a"] == {"robot": "a", "velocity": 1, "temp": None}
    assert rows["b"]["velocity"] == 2**31 - 1  # an old int row read through the promoted type
    assert rows["c"] == {"robot": "c", "velocity": 2**40, "temp": 21.5}
    assert rows["d"] == {"robot": "d", "velocity": 7, "temp": 22.0}
    assert table.scan(row_filter="velocity > 100").to_arrow().num_rows == 2

    before = (table.metadata_location, len(table.snapshots()), table.schema())
    lane.write("pose", "000004", V4, {"robot": ["e"], "velocity": [1], "temp": [1.0]})
    lane.ship()
    with pytest.raises(IcebergSchemaMismatch) as caught:
        Registrar(lane.config()).run_once()
    message = str(caught.value)
    assert message.startswith("sink.iceberg_schema_mismatch")
    assert "velocity (field id 2): table long, segment int (narrowing)" in message
    assert "temp (field id 5): table double, segment float (narrowing)" in message
    table = lane.table("pose")
    assert (table.metadata_location, len(table.snapshots()), table.schema()) == before
    assert len(data_files(table)) == 3


def test_unsigned_column_is_fatal_and_names_the_fix(lane: Lane) -> None:
    schema = pa.schema([field("robot", pa.string(), 1), field("_wal_pos", pa.uint64(), 2)])
    lane.write("pose", "000001", schema, {"robot": ["a"], "_wal_pos": [3]})
    lane.ship()
    with pytest.raises(IcebergUnsupportedType) as caught:
        Registrar(lane.config()).run_once()
    assert "_wal_pos (uint64)" in str(caught.value)
    assert "unsigned: signed" in str(caught.value)
    assert not lane.table_exists("pose")


@pytest.mark.parametrize(
    ("schema", "columns", "says"),
    [
        (
            pa.schema([field("robot", pa.string(), 1), field("t", pa.int64(), 1)]),
            {"robot": ["a"], "t": [1]},
            "field id 1 is used by both robot and t",
        ),
        (
            pa.schema(
                [
                    field("t", pa.int64(), 2),
                    field("loc", pa.struct([field("x", pa.float64(), 2)]), 3),
                ]
            ),
            {"t": [1], "loc": [{"x": 1.0}]},
            "field id 2 is used by both t and loc.x",
        ),
        (
            pa.schema([field("robot", pa.string(), 1), field("ts", pa.timestamp("ns"), 2)]),
            {"robot": ["a"], "ts": [1]},
            "unsupported type: timestamp[ns]",
        ),
        (pa.schema([]), {}, "the segment has no columns"),
    ],
    ids=["repeated-id", "repeated-nested-id", "timestamp-ns", "no-columns"],
)
def test_a_segment_schema_iceberg_cannot_hold_is_typed_and_touches_nothing(
    lane: Lane, schema: pa.Schema, columns: dict[str, list[object]], says: str
) -> None:
    # Each used to escape as a raw ValueError, UnsupportedPyArrowTypeException or
    # IndexError, or reached the catalog as a 400 after the table was created.
    lane.write("pose", "000001", schema, columns)
    lane.ship()
    with pytest.raises(IcebergUnsupportedType) as caught:
        Registrar(lane.config()).run_once()
    assert says in str(caught.value)
    assert not lane.table_exists("pose")


def test_missing_table_without_create_table_is_fatal(lane: Lane) -> None:
    lane.write("pose", "000001", V1, {"robot": ["a"], "speed": [1]})
    lane.ship()
    with pytest.raises(ConfigInvalid, match="create_table is false"):
        Registrar(lane.config(create_table=False)).run_once()
    assert not lane.table_exists("pose")


def test_crash_between_create_and_its_exact_schema_commit_is_finished(lane: Lane) -> None:
    # Ids in the reverse of the order a catalog assigns them.
    reverse = pa.schema([field("robot", pa.string(), 2), field("speed", pa.int32(), 1)])
    lane.write("pose", "000001", reverse, {"robot": ["a"], "speed": [7]})
    lane.ship()
    config = lane.config()

    # The state a registrar killed inside Tables.create leaves: the catalog's
    # create landed (its own ids), the commit of the segment's ids did not.
    from lake_iceberg.registrar.schema_merge import file_schema

    catalog = lane.server.catalog()
    catalog.create_namespace_if_not_exists(config.namespace)
    catalog.create_table(
        (*config.namespace, "pose"),
        file_schema(reverse, "pose"),
        properties={"format-version": "2"},
    )
    assert [(f.field_id, f.name) for f in lane.table("pose").schema().fields] == [
        (1, "robot"),
        (2, "speed"),
    ]

    # Restarted, it finishes the create instead of stopping on a schema mismatch.
    assert Registrar(config).run_once().registered == 1
    table = lane.table("pose")
    assert [(f.field_id, f.name) for f in table.schema().fields] == [(2, "robot"), (1, "speed")]
    assert table.scan().to_arrow().to_pylist() == [{"robot": "a", "speed": 7}]
    assert len(data_files(table)) == 1


def test_crash_between_schema_commit_and_append_only_appends(lane: Lane) -> None:
    lane.write("pose", "000001", V1, {"robot": ["a"], "speed": [1]})
    lane.ship()
    config = lane.config()
    assert Registrar(config).run_once().registered == 1
    lane.write("pose", "000002", V2, {"robot": ["b"], "speed": [2], "temp": [1.0]})
    lane.ship()

    # The state a registrar that died right after its schema commit leaves.
    from lake_iceberg.registrar.schema_merge import file_schema, merge_schema
    from lake_iceberg.registrar.tables import Tables

    catalog = lane.server.catalog()
    tables = Tables(config, catalog)
    table = lane.table("pose")
    merged = merge_schema(table.schema(), file_schema(V2, "pose"), next_schema_id=1)
    tables.commit_schema(table, merged.schema)
    evolved = lane.table("pose")
    schemas = len(evolved.metadata.schemas)

    assert Registrar(config).run_once().registered == 1
    table = lane.table("pose")
    assert len(table.metadata.schemas) == schemas  # nothing left to change
    assert table.schema().schema_id == evolved.schema().schema_id
    assert len(table.snapshots()) == 2
    assert len(data_files(table)) == 2


def test_fatal_error_stops_the_cli_with_its_code(lane: Lane) -> None:
    import subprocess
    import sys

    import yaml

    lane.write("pose", "000001", V1, {"robot": ["a"], "speed": [1]})
    lane.ship()
    path = lane.root / "registrar.yaml"
    path.write_text(yaml.safe_dump(lane.raw_config(create_table=False)))
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lake_core.cli import main; main()",
            "iceberg",
            "registrar",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "error: config.invalid: table" in result.stderr
    assert '"code": "config.invalid"' in result.stderr  # the structured registrar.fatal line
    assert lane.server.secret_key not in result.stderr


def test_name_mapping_follows_the_files_ids_and_keeps_old_names(lane: Lane) -> None:
    import json

    # Ids in the reverse of the order a catalog would assign them.
    first = pa.schema([field("robot", pa.string(), 2), field("speed", pa.int32(), 1)])
    renamed = pa.schema([field("robot", pa.string(), 2), field("velocity", pa.int32(), 1)])
    lane.write("pose", "000001", first, {"robot": ["a"], "speed": [1]})
    lane.ship()
    config = lane.config()
    Registrar(config).run_once()
    lane.write("pose", "000002", renamed, {"robot": ["b"], "velocity": [2]})
    lane.ship()
    Registrar(config).run_once()
    mapping = json.loads(lane.table("pose").properties["schema.name-mapping.default"])
    names = {entry["field-id"]: entry["names"] for entry in mapping}
    assert names == {2: ["robot"], 1: ["velocity", "speed"]}
