"""``lake table`` on a local data dir, and ``lake meta``'s process behaviour."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from click.testing import CliRunner

from lake_core.filetype import is_file_field
from lake_core.ids import new_operation_id
from lake_core.names import TableRef
from lake_core.schemas import schema_from_ipc
from lake_core.telemetry.metrics import REGISTRY
from lake_metasrv.cli import run_server, table
from lake_metasrv.config import MetaConfig
from lake_metasrv.registry import SqliteRegistry
from tools.lake_testing.servers import start_meta
from tools.lake_testing.waiting import until_async


def lake_table(*args: str) -> Any:
    return CliRunner().invoke(table, list(args), catch_exceptions=False)


def test_create_list_describe_drop(tmp_path: Path) -> None:
    data = str(tmp_path / "lake-data")
    created = lake_table(
        "create",
        "robots.episodes",
        "--column",
        "episode_id:utf8",
        "--column",
        "reward:float64",
        "--column",
        "video:file",
        "--data-dir",
        data,
    )
    assert created.exit_code == 0, created.output
    info = json.loads(created.output)
    assert info["table"] == "robots.episodes"
    assert info["version"] == 0
    assert info["columns"] == ["episode_id: string", "reward: double", "video: file"]

    listed = json.loads(lake_table("list", "--data-dir", data).output)
    assert [t["table"] for t in listed] == ["robots.episodes"]
    described = json.loads(
        lake_table("describe", "lake.robots.episodes", "--data-dir", data).output
    )
    assert described["versions"] == [{"version": 0, "engine_version": 1}]

    async def stored_schema() -> pa.Schema:
        registry = SqliteRegistry(Path(data) / "registry.sqlite3")
        await registry.open()
        record = await registry.get_table(TableRef("robots", "episodes"))
        await registry.close()
        assert record is not None
        return schema_from_ipc(record.schema_ipc)

    schema = asyncio.run(stored_schema())
    assert is_file_field(schema.field("video"))

    again = lake_table("create", "robots.episodes", "--column", "a:int64", "--data-dir", data)
    assert again.exit_code == 2
    assert "already exists" in again.output
    dropped = lake_table("drop", "robots.episodes", "--data-dir", data)
    assert dropped.exit_code == 0
    assert "dropped robots.episodes at version 0" in dropped.output
    assert json.loads(lake_table("list", "--data-dir", data).output) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "Robots.episodes", "--column", "a:int64"], "lowercase"),
        (["create", "robots/../x.y", "--column", "a:int64"], "robots"),
        (["create", "robots.episodes", "--column", "a:decimal"], "unknown type"),
        (["create", "robots.episodes", "--column", "a"], "name:type"),
        (["describe", "robots.nothing"], "table not found"),
    ],
)
def test_bad_input_fails_before_storage(tmp_path: Path, args: list[str], message: str) -> None:
    data = tmp_path / "lake-data"
    result = lake_table(*args, "--data-dir", str(data))
    assert result.exit_code == 2
    assert message in result.output
    if args[0] == "create":
        assert not data.exists()


def test_meta_process_logs_json_and_holds_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    meta = start_meta(data, tmp_path)
    try:
        refused = lake_table("list", "--data-dir", str(data))
        # Unavailable: busy until that process stops, so retryable (docs/cli.md "Exit status").
        assert refused.exit_code == 75
        assert "in use by another Lake process" in refused.output
    finally:
        code = meta.stop()
    assert code == 0
    lines = meta.log().splitlines()
    assert f"lake meta listening on {meta.addr}" in lines
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert any(r.get("event") == "metasrv serving" for r in records)
    assert len(records) + 1 == len(lines), "every other stderr line is a JSON log record"
    # The lock is released on exit.
    assert lake_table("list", "--data-dir", str(data)).exit_code == 0


@pytest.mark.asyncio
async def test_drain_past_the_grace_exits_non_zero(tmp_path: Path) -> None:
    config = replace(
        MetaConfig.load(data_dir=tmp_path / "data", addr="127.0.0.1:0", env={}),
        shutdown_grace_ms=300,
    )
    stop = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        run_server(config, stop=stop, on_started=lambda s: started.set_result(s.port))
    )
    port = await asyncio.wait_for(started, 30)
    streaming, release = threading.Event(), threading.Event()
    schema = pa.schema([("a", pa.int64())])

    def hold_an_append_open() -> None:
        client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
        cmd = {"table": {"namespace": "n", "name": "t"}, "operation_id": new_operation_id()}
        writer, _ = client.do_put(fl.FlightDescriptor.for_command(json.dumps(cmd).encode()), schema)
        writer.write_batch(pa.record_batch([pa.array([1])], schema=schema))
        streaming.set()
        release.wait(30)
        try:
            with pytest.raises(fl.FlightError):
                writer.close()  # the server cut the stream off at the end of the grace
        finally:
            client.close()

    holder = asyncio.create_task(asyncio.to_thread(hold_an_append_open))
    await asyncio.to_thread(streaming.wait, 30)
    await until_async(
        lambda: (REGISTRY.get_sample_value("lake_rpc_in_flight") or 0) >= 1,
        10,
        "the server holding the append",
    )
    stop.set()
    assert await asyncio.wait_for(server, 30) == 1
    release.set()
    await holder
