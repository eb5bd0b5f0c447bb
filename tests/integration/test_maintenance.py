"""Maintenance through real processes: `lake client`, Metasrv, Query, pyarrow Flight.

Compaction and index creation keep the rows and the Lake version; tickets
issued before them still read their pinned Lance version; Query refreshes to
the new one and uses the index for key lookups; a Metasrv killed between the
Lance maintenance write and the registry move comes back readable, and the
next append is fine.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import lance
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from click.testing import CliRunner
from google.protobuf import any_pb2

import lake_sdk
from lake_core import faults
from lake_core.admin_cli import client as admin_cli
from lake_core.errors import LakeError
from lake_core.metaclient import MetaClient
from lake_core.proto import flight_sql_pb2
from lake_metasrv.registry import SqliteRegistry
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.faults import fault_env
from tools.lake_testing.plugin import LakeCluster
from tools.lake_testing.servers import start_meta

APPENDS = 12
ROWS = 25


def _statement(sql: str) -> flight.FlightDescriptor:
    wrapper = any_pb2.Any()
    wrapper.Pack(flight_sql_pb2.CommandStatementQuery(query=sql))
    return flight.FlightDescriptor.for_command(wrapper.SerializeToString())


def _query(client: flight.FlightClient, sql: str) -> pa.Table:
    info = client.get_flight_info(_statement(sql))
    return client.do_get(info.endpoints[0].ticket).read_all()


def _plan(client: flight.FlightClient, sql: str) -> str:
    return "\n".join(
        str(p) for p in _query(client, f"EXPLAIN ANALYZE {sql}").column("plan").to_pylist()
    )


def _admin(meta_addr: str, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(admin_cli, ["--addr", meta_addr, *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def _load(cluster: LakeCluster) -> None:
    create_table(cluster.meta.addr, EPISODES, EPISODES_SCHEMA)
    with lake_sdk.connect(cluster.query.url) as sdk:
        for i in range(APPENDS):
            sdk.append_batches(EPISODES, [episodes(i * ROWS, ROWS)])


def _eventually(check: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            assert callable(check)
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_optimize_and_index_keep_rows_and_version_and_query_uses_them(
    lake_cluster: LakeCluster,
) -> None:
    _load(lake_cluster)
    sql = "SELECT * FROM robots.episodes ORDER BY steps"
    expected = pa.Table.from_batches([episodes(i * ROWS, ROWS) for i in range(APPENDS)])
    with flight.FlightClient(f"grpc+tcp://{lake_cluster.query.addr}") as client:
        pinned_before = client.get_flight_info(_statement(sql))
        assert "fragments_scanned=12" in _plan(client, "SELECT * FROM robots.episodes")

        optimized = _admin(lake_cluster.meta.addr, "optimize-table", "robots.episodes")
        assert optimized["changed"]
        assert optimized["version"] == APPENDS
        assert (optimized["fragments_before"], optimized["fragments_after"]) == (APPENDS, 1)
        indexed = _admin(lake_cluster.meta.addr, "create-index", "robots.episodes", "steps")
        assert indexed["indexes"] == ["steps_idx"]
        assert indexed["version"] == APPENDS

        dataset = lance.dataset(str(lake_cluster.root / "data/tables/robots/episodes.lance"))
        assert [d.name for d in dataset.describe_indices()] == ["steps_idx"]

        # The ticket issued before compaction still reads its pinned version.
        old = client.do_get(pinned_before.endpoints[0].ticket).read_all()
        assert old.equals(expected)

        # Query refreshes its catalog and plans on the compacted, indexed version.
        def compacted_and_indexed() -> None:
            plan = _plan(client, "SELECT * FROM robots.episodes WHERE steps IN (7, 260)")
            assert "ScalarIndexExec" in plan, plan
            assert "fragments_scanned=1" in plan, plan

        _eventually(compacted_and_indexed)
        assert _query(client, sql).equals(expected)
        hits = _query(client, "SELECT episode_id, steps FROM robots.episodes WHERE steps = 260")
        assert hits.column("steps").to_pylist() == [260]
        assert (
            hits.column("episode_id").to_pylist()
            == expected.filter(pa.compute.equal(expected.column("steps"), 260))
            .column("episode_id")
            .to_pylist()
        )

    # A bad column is a typed error and writes nothing.
    before = dataset.latest_version
    result = CliRunner().invoke(
        admin_cli, ["--addr", lake_cluster.meta.addr, "create-index", "robots.episodes", "nope"]
    )
    assert result.exit_code != 0
    assert "no column 'nope'" in str(result.exception or result.output)
    assert lance.dataset(dataset.uri).latest_version == before


def test_kill_between_lance_write_and_registry_move(tmp_path: Path) -> None:
    hooks = {
        **fault_env(faults.AFTER_LANCE_WRITE),
        "LAKE_COMPACTION": "off",
    }
    meta = start_meta(tmp_path / "data", tmp_path, env=hooks)
    location = tmp_path / "data/tables/robots/episodes.lance"

    async def load() -> None:
        async with MetaClient(meta.http_url) as admin:
            await admin.create_table(EPISODES, EPISODES_SCHEMA)
            for i in range(6):
                await _append(admin, i)

    try:
        asyncio.run(load())
        registered = asyncio.run(_registered(tmp_path))

        async def optimize() -> None:
            async with MetaClient(meta.http_url, timeout_s=30) as admin:
                await admin.optimize_table(EPISODES)

        with pytest.raises(LakeError):
            asyncio.run(optimize())
        assert meta.proc is not None
        assert meta.proc.wait(30) == 137
        # Lance wrote a compacted version the registry never saw.
        assert lance.dataset(str(location)).latest_version > registered
        assert asyncio.run(_registered(tmp_path)) == registered

        meta.env = {"LAKE_COMPACTION": "off"}
        meta.restart()

        async def after() -> int:
            async with MetaClient(meta.http_url) as admin:
                result = await _append(admin, 6)
                return result

        assert asyncio.run(after()) == 7
    finally:
        meta.stop()

    final = asyncio.run(_registered(tmp_path))
    rows = lance.dataset(str(location), version=final).to_table().sort_by("steps")
    assert rows.equals(
        pa.Table.from_batches([episodes(i * ROWS, ROWS) for i in range(7)]).sort_by("steps")
    )


async def _append(admin: MetaClient, i: int) -> int:
    from lake_core import protocol
    from lake_core.ids import new_operation_id

    command = protocol.AppendCommand(table=EPISODES, operation_id=new_operation_id())
    result = await admin.append(command, EPISODES_SCHEMA, [episodes(i * ROWS, ROWS)])
    return result.version


async def _registered(root: Path) -> int:
    registry = SqliteRegistry(root / "data" / "registry.sqlite3")
    await registry.open()
    try:
        record = await registry.get_table(EPISODES)
        assert record is not None
        history = await registry.versions(record.incarnation)
        assert [v.version for v in history] == list(range(record.version + 1))
        assert history[-1].engine_version == record.engine_version
        return record.engine_version
    finally:
        await registry.close()
