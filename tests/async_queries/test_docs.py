"""docs/async-queries.md's example runs as written, twice, against two replicas.

The page's two addresses become two real Query replicas that share the async
state (no principals file: loopback development, as the page shows it).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lake_sdk
from tests.async_queries.conftest import AsyncLake
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import start_meta

PAGE = Path(__file__).resolve().parents[2] / "docs" / "async-queries.md"


def test_the_page_example_runs_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [code] = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    keys = str(write_ticket_keys(tmp_path / "ticket-keys.json"))
    env = {"LAKE_QUERY_TICKET_KEYS_FILE": keys, "LAKE_ASYNC_QUERIES": "true"}
    meta = start_meta(tmp_path / "data", tmp_path, env={"LAKE_QUERY_TICKET_KEYS_FILE": keys})
    lake = AsyncLake(root=tmp_path, meta=meta, env=env)
    try:
        first, second = lake.add_query(), lake.add_query()
        create_table(meta.addr, EPISODES, EPISODES_SCHEMA)
        with lake_sdk.Client(first.url) as client:
            client.append_batches(EPISODES, [episodes(0, 1500)])
        code = code.replace("grpc://127.0.0.1:50051", first.url)
        code = code.replace("grpc://127.0.0.1:50052", second.url)
        for _ in range(2):
            names: dict[str, object] = {"__name__": "__main__"}
            exec(compile(code, str(PAGE), "exec"), names)
            table = names["table"]
            assert getattr(table, "num_rows") == 1500  # noqa: B009 - exec'd names are untyped
        printed = capsys.readouterr().out.split()
        assert "done" in printed or "running" in printed or "pending" in printed
        assert sum(int(n) for n in printed if n.isdigit()) == 2 * 1500
    finally:
        lake.stop()
