"""Durable async queries on real processes: one Metasrv, Query replicas sharing keys and state.

Local mode: every replica runs with ``--data-dir`` (Metasrv's), so the async
state and results live beside the catalog and any replica can resume a job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import lake_sdk
from tools.lake_testing.data import EPISODES, EPISODES_SCHEMA, create_table, episodes
from tools.lake_testing.plugin import write_ticket_keys
from tools.lake_testing.servers import (
    LakeProcess,
    meta_process,
    query_process,
    restart_together,
    start_together,
    wait_healthy,
)

SQL = "SELECT episode_id, steps, reward FROM robots.episodes ORDER BY steps"
#: Runs for seconds (8e9 joined rows over 2,000 loaded), with a one-row result: long
#: enough to be cancelled or to hold a worker slot, short enough to finish when nothing
#: stops it (a cancel interrupts it mid-batch: test_interrupt.py). A sum, not a count:
#: DataFusion answers count(*) of a cross join from row-count statistics without running it.
FOREVER = (
    "SELECT sum(a.steps + b.steps + c.steps) AS n "
    "FROM robots.episodes a, robots.episodes b, robots.episodes c"
)
#: Bearer tokens of two tenants (and a second principal of the first).
TOKENS = {
    "acme": "lk_acme_token_0001",
    "acme2": "lk_acme_token_0002",
    "globex": "lk_globex_token_01",
}


def _principals(path: Path) -> Path:
    bindings = [
        {"token": TOKENS["acme"], "principal_id": "ann", "tenant_id": "acme", "role": "admin"},
        {
            "token": TOKENS["acme2"],
            "principal_id": "bob",
            "tenant_id": "acme",
            "role": "user",
            "namespaces": ["robots"],
        },
        {
            "token": TOKENS["globex"],
            "principal_id": "gus",
            "tenant_id": "globex",
            "role": "user",
            "namespaces": ["robots"],
        },
    ]
    path.write_text(json.dumps({"bindings": bindings}))
    path.chmod(0o600)
    return path


def client(replica: LakeProcess, who: str = "acme") -> lake_sdk.Client:
    return lake_sdk.Client(replica.url, token=TOKENS[who], connect_timeout=60)


@dataclass
class AsyncLake:
    root: Path
    meta: LakeProcess
    env: dict[str, str]
    queries: list[LakeProcess] = field(default_factory=list)
    #: ``meta`` was launched but may not serve yet: the first replicas start beside it.
    meta_starting: bool = False

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def wait_meta(self) -> LakeProcess:
        """``meta``, once it reports SERVING."""
        if self.meta_starting:
            wait_healthy(self.meta, 60.0)
            self.meta_starting = False
        return self.meta

    def add_query(self, env: dict[str, str] | None = None) -> LakeProcess:
        return self.add_queries(env)[0]

    def add_queries(self, *envs: dict[str, str] | None) -> list[LakeProcess]:
        """One more replica per ``env`` (its additions to the lake's), started together
        (and beside ``meta`` if that is still starting)."""
        replicas = [
            query_process(
                self.meta.addr,
                self.root,
                env={**self.env, **(env or {})},
                extra_args=("--data-dir", str(self.data_dir)),
                probe_token=TOKENS["acme"],
            )
            for env in envs or (None,)
        ]
        self.queries.extend(replicas)
        start_together(*([self.meta] if self.meta_starting else []), *replicas)
        self.meta_starting = False
        return replicas

    def restart(self, *replicas: LakeProcess) -> None:
        """Restart ``replicas`` (each a SIGTERM and a new process), started together."""
        restart_together(*replicas)

    def jobs(self) -> list[dict[str, object]]:
        """Every job record in the state directory, as stored."""
        folder = self.data_dir / "async-query-state" / "job"
        return [json.loads(p.read_text())["doc"] for p in sorted(folder.glob("*.json"))]

    def stop(self) -> None:
        for replica in self.queries:
            replica.stop()
        self.meta.stop()


@pytest.fixture
def async_lake(tmp_path: Path) -> Iterator[AsyncLake]:
    env = {
        "LAKE_QUERY_TICKET_KEYS_FILE": str(write_ticket_keys(tmp_path / "ticket-keys.json")),
        "LAKE_ASYNC_QUERIES": "true",
        "LAKE_QUERY_CATALOG_REFRESH_MS": "200",
        "LAKE_AUTH_PRINCIPALS_FILE": str(_principals(tmp_path / "principals.json")),
    }
    meta = meta_process(
        tmp_path / "data",
        tmp_path,
        env={"LAKE_QUERY_TICKET_KEYS_FILE": env["LAKE_QUERY_TICKET_KEYS_FILE"]},
    )
    # Launched, not awaited: the test's first replicas start beside it (add_queries).
    lake = AsyncLake(root=tmp_path, meta=meta.launch(), env=env, meta_starting=True)
    try:
        yield lake
    finally:
        lake.stop()


@pytest.fixture
def loaded(async_lake: AsyncLake) -> Callable[[int], None]:
    """``loaded(rows)``: create the episodes table with that many rows (appends of 1,000)."""

    def load(rows: int) -> None:
        create_table(async_lake.wait_meta().addr, EPISODES, EPISODES_SCHEMA)
        replica = async_lake.queries[0] if async_lake.queries else async_lake.add_query()
        with client(replica) as sdk:
            for start in range(0, rows, 1000):
                sdk.append_batches(EPISODES, [episodes(start, min(1000, rows - start))])

    return load
