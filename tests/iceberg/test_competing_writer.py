"""A competing writer commits just before the registrar, deterministically, in-process."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table.update import AddSnapshotUpdate

from lake_iceberg.registrar.append import SEGMENT_KEY
from lake_iceberg.registrar.segments import SegmentCatalog
from lake_iceberg.registrar.service import Registrar
from lake_iceberg.registrar.tables import catalog_properties
from lake_iceberg.registrar.transport import RegistrarCatalog
from tests.iceberg.conftest import Lane, data_files, field, segment_keys

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

SCHEMA = pa.schema([field("robot", pa.string(), 1), field("t", pa.int64(), 2)])


class RacingCatalog(RegistrarCatalog):
    """Runs ``before_append`` once, just before the registrar's first append commit."""

    before_append: Any = None

    def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
        hook, self.before_append = self.before_append, None
        if hook is not None and any(isinstance(u, AddSnapshotUpdate) for u in updates):
            hook()
        return super().commit_table(table, requirements, updates)


def test_conflict_reloads_skips_what_the_other_writer_registered(lane: Lane) -> None:
    lane.write("pose", "000001", SCHEMA, {"robot": ["a"], "t": [1]})
    lane.ship()
    config = lane.config()
    assert Registrar(config).run_once().registered == 1  # the table exists now

    lane.write("pose", "000002", SCHEMA, {"robot": ["b"], "t": [2]})
    lane.write("pose", "000003", SCHEMA, {"robot": ["c"], "t": [3]})
    lane.ship()
    with SegmentCatalog(lane.segments) as segments:
        second, third = segments.entries()[1:]

    def other_writer() -> None:
        # Another writer registers segment 3 (with its key) before our commit of 2.
        table = lane.table("pose")
        tx = table.transaction()
        with tx.update_snapshot(
            snapshot_properties={SEGMENT_KEY: third.object_key}
        ).fast_append() as fa:
            from lake_iceberg.registrar.append import build_data_file
            from lake_iceberg.registrar.footer import read_footer
            from lake_iceberg.registrar.schema_merge import file_schema

            footer = read_footer(lane.s3(), third)
            segment = file_schema(footer.schema.to_arrow_schema(), "pose")
            fa.append_data_file(build_data_file(table, third, footer, segment))
        tx.commit_transaction()

    catalog = RacingCatalog("racing", **catalog_properties(config))
    catalog.before_append = other_writer
    commits: list[Any] = []
    original = catalog.commit_table

    def counting(table: Any, requirements: Any, updates: Any) -> Any:
        commits.append(updates)
        return original(table, requirements, updates)

    catalog.commit_table = counting  # type: ignore[method-assign]
    progress = Registrar(config, catalog=catalog).run_once()

    assert catalog.before_append is None  # the race happened
    assert len(commits) == 2  # the conflicted commit of 2, then its rebuilt retry
    assert (progress.registered, progress.skipped) == (1, 2)
    table = lane.table("pose")
    prefix = f"s3://{lane.bucket}/fleet/lake/v1/edge-capture/pose/"
    assert data_files(table) == [prefix + f"00000{i}.parquet" for i in (1, 2, 3)]
    assert segment_keys(table) == sorted(
        f"fleet/lake/v1/edge-capture/pose/00000{i}.parquet" for i in (1, 2, 3)
    )
    assert sorted(table.scan().to_arrow().column("robot").to_pylist()) == ["a", "b", "c"]
    assert second.object_key in segment_keys(table)
