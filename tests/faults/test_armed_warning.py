"""A server started with fault points armed says so, naming them, before it listens."""

from __future__ import annotations

import json
from pathlib import Path

from lake_core import faults
from lake_core.config import FAULTS
from tools.lake_testing.faults import fault_env
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import LakeProcess, start_meta, start_query


def _records(process: LakeProcess) -> list[dict[str, object]]:
    lines = process.log().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _armed_warnings(process: LakeProcess) -> list[dict[str, object]]:
    return [r for r in _records(process) if r.get("variable") == FAULTS]


def _listening_at(records: list[dict[str, object]]) -> int:
    return next(i for i, r in enumerate(records) if " listening on " in str(r.get("event")))


def test_meta_and_query_name_their_armed_fault_points(tmp_path: Path) -> None:
    meta = start_meta(tmp_path / "data", tmp_path, env=fault_env(faults.BEFORE_LANCE_COMMIT))
    try:
        query = start_query(meta.addr, tmp_path, env=fault_env(faults.ASYNC_AFTER_PART))
        try:
            for process, point in (
                (meta, faults.BEFORE_LANCE_COMMIT),
                (query, faults.ASYNC_AFTER_PART),
            ):
                [warning] = _armed_warnings(process)
                assert warning["level"] == "warning"
                assert warning["points"] == [point]
                assert warning["settings"] == {}
                records = _records(process)
                assert records.index(warning) < _listening_at(records)
        finally:
            query.stop()
    finally:
        meta.stop()


def test_servers_with_nothing_armed_do_not_warn(lake_cluster: LakeCluster) -> None:
    for process in (lake_cluster.meta, lake_cluster.query):
        assert _listening_at(_records(process)) >= 0
        assert _armed_warnings(process) == []
