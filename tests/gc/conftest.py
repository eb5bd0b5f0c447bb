"""Fixtures for ``lake gc``: a real Metasrv, objects uploaded as the SDK does, GC as a subprocess.

The test process plays the SDK (uploads straight to the stage, appends the
rows through Metasrv's DoPut) and the operator (runs ``lake gc`` as its own
process, exactly as a cron job would).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.filetype import FILE_STRUCT, file_field
from lake_core.ids import new_operation_id
from lake_core.metaclient import MetaClient
from lake_core.models import DataLocation
from lake_core.names import TableRef
from lake_gc import ApplyResult, GcTarget, Plan, apply_plan, load_plan, make_plan
from lake_objects import FileUpload, open_store
from lake_objects.settings import StageSettings
from tools.lake_testing.servers import LakeProcess, start_meta

EPISODES = TableRef("robots", "episodes")
SCRATCH = TableRef("robots", "scratch")
SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), file_field("video")])
TENANT = "local"  # the loopback dev principal's tenant
HOUR_S = 3600


def file_batch(locations: list[DataLocation], start: int = 0) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([f"ep-{start + i}" for i in range(len(locations))]),
            pa.array([loc.model_dump() for loc in locations], FILE_STRUCT),
        ],
        schema=SCHEMA,
    )


def run_gc(
    data_dir: Path, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300
) -> tuple[int, dict[str, Any]]:
    """``lake --data-dir DATA gc ARGS --json`` in its own process: (exit code, JSON reply)."""
    command = [
        sys.executable,
        "-c",
        "from lake_core.cli import main; main()",
        "--data-dir",
        str(data_dir),
        "gc",
        *args,
        "--json",
    ]
    done = subprocess.run(
        command,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    try:
        reply = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        reply = {"stdout": done.stdout}
    reply.setdefault("_stderr", done.stderr[-3000:])
    return done.returncode, reply


def age(path: Path, seconds: float) -> None:
    """Backdate a local file's modification time (a local object's age)."""
    then = time.time() - seconds
    os.utime(path, (then, then))


@dataclass
class Lake:
    """A Metasrv with a data directory, its stage, and SDK-side helpers."""

    root: Path
    data: Path
    meta: LakeProcess
    stage: StageSettings
    env: dict[str, str] = field(default_factory=dict)

    def admin(self, work: Any) -> Any:
        async def go() -> Any:
            async with MetaClient(f"http://{self.meta.addr}", timeout_s=120) as client:
                return await work(client)

        return asyncio.run(go())

    def create(self, table: TableRef = EPISODES) -> None:
        self.admin(lambda c: c.create_table(table, SCHEMA))

    def append(self, locations: list[DataLocation], table: TableRef = EPISODES) -> int:
        command = protocol.AppendCommand(table=table, operation_id=new_operation_id())
        result = self.admin(lambda c: c.append(command, SCHEMA, [file_batch(locations)]))
        return int(result.version)

    def upload(self, data: bytes, name: str = "clip") -> DataLocation:
        source = self.root / f"{name}-{os.urandom(4).hex()}.bin"
        source.write_bytes(data)

        async def go() -> DataLocation:
            store = open_store(self.stage.descriptor(TENANT))
            try:
                return await store.upload(FileUpload.from_path(source, "video/mp4"))
            finally:
                await store.close()

        return asyncio.run(go())

    def verify(self, location: DataLocation) -> bytes:
        """Read the object back through the stage: size and SHA-256 proven at EOF."""

        async def go() -> bytes:
            store = open_store(self.stage.descriptor(TENANT))
            try:
                async with await store.open(location) as reader:
                    return await reader.read()
            finally:
                await store.close()

        return asyncio.run(go())

    def retained_locations(self, table: TableRef = EPISODES) -> list[DataLocation]:
        """Every FILE value of every Lance version the table still retains."""
        entry = self.admin(lambda c: c.describe_table(table)).entry
        options = self.storage_options(entry.descriptor.location)
        uri = self.lance_uri(entry.descriptor.location)
        found: dict[str, DataLocation] = {}
        for version in lance.dataset(uri, storage_options=options).versions():
            rows = lance.dataset(uri, version=version["version"], storage_options=options)
            for value in rows.to_table(columns=["video"]).column("video").to_pylist():
                if value is not None:
                    found[value["uri"]] = DataLocation(**value)
        return list(found.values())

    def lance_uri(self, location: str) -> str:
        return location

    def storage_options(self, location: str) -> dict[str, str] | None:
        return None

    def gc(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        """``lake gc`` as its own process."""
        return run_gc(self.data, *args, env={**self.env, **(env or {})})

    # In-process twins of the command, for checks that need many runs.

    def target(self) -> GcTarget:
        return GcTarget.from_env(self.data, {**os.environ, **self.env})

    def plan(self, directory: Path, safety_age_secs: int, page_size: int = 1000) -> Plan:
        target = self.target()
        return make_plan(
            directory,
            roots=target.roots,
            sidecars=target.sidecars,
            stage=target.stage,
            safety_age_secs=safety_age_secs,
            page_size=page_size,
        )

    def apply(self, directory: Path, checkpoint: Path) -> ApplyResult:
        target = self.target()
        return apply_plan(
            load_plan(directory),
            checkpoint,
            roots=target.roots,
            sidecars=target.sidecars,
            stage=target.stage,
        )


@pytest.fixture
def local_lake(tmp_path: Path) -> Iterator[Lake]:
    """Metasrv on ``tmp/data`` with its default local stage ``tmp/data/objects``."""
    data = tmp_path / "data"
    meta = start_meta(data, tmp_path)
    try:
        yield Lake(tmp_path, data, meta, StageSettings.local(data / "objects"))
    finally:
        meta.stop()


class SteadyWriter:
    """Appends a fresh FILE value to a table over and over, in a thread, until stopped.

    What a fleet does while GC runs: every append uploads a new object first
    (young, so never a candidate) and commits a new version.
    """

    def __init__(self, lake: Lake, table: TableRef = EPISODES) -> None:
        import threading

        self.lake = lake
        self.table = table
        self.appended: list[DataLocation] = []
        self.versions: list[int] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-writer", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                location = self.lake.upload(os.urandom(64), "fleet")
                self.versions.append(self.lake.append([location], self.table))
                self.appended.append(location)
            except BaseException as exc:
                self.errors.append(exc)
                return

    def commits(self) -> int:
        return len(self.versions)

    def wait_for_commits(self, more: int, timeout_s: float = 120.0) -> None:
        """Until ``more`` commits landed after this call."""
        target = self.commits() + more
        deadline = time.monotonic() + timeout_s
        while self.commits() < target:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, "the writer stopped committing"
            time.sleep(0.02)

    def __enter__(self) -> SteadyWriter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive()
