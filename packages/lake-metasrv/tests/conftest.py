"""Fixtures for Metasrv unit tests: a local coordinator and a served handler."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pytest
import pytest_asyncio

from lake_core.filetype import FILE_STRUCT, file_field
from lake_core.flight.server import FlightServer, serve
from lake_core.names import TableRef
from lake_metasrv.cli import loopback_principal
from lake_metasrv.commits import CommitCoordinator
from lake_metasrv.config import MetaConfig
from lake_metasrv.registry.dynamo import DynamoRegistry
from lake_metasrv.service import MetaHandler
from tools.lake_testing.dynalite import Dynalite

EPISODES = TableRef("robots", "episodes")
SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), pa.field("reward", pa.float64())])
FILE_SCHEMA = pa.schema([pa.field("episode_id", pa.utf8()), file_field("video")])


def make_batch(n: int, start: int = 0, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    ids = pa.array([f"ep-{i}" for i in range(start, start + n)])
    if schema is FILE_SCHEMA:
        videos = pa.array(
            [
                {
                    "uri": f"file:///stage/tenants/local/v{i}.mp4",
                    "media_type": "video/mp4",
                    "size_bytes": i,
                    "sha256": "ab" * 32,
                }
                for i in range(start, start + n)
            ],
            FILE_STRUCT,
        )
        return pa.record_batch([ids, videos], schema=schema)
    return pa.record_batch([ids, pa.array([float(i) for i in range(start, start + n)])], schema)


@pytest.fixture
def config(tmp_path: Path) -> MetaConfig:
    # FILE cells in these tests name objects under /stage/tenants/local.
    return MetaConfig.load(data_dir=tmp_path / "data", env={"LAKE_MANAGED_OBJECT_ROOT": "/stage"})


@pytest.fixture
def make_coordinator(
    config: MetaConfig,
) -> Callable[..., CommitCoordinator]:
    def make(**changes: object) -> CommitCoordinator:
        return CommitCoordinator.local(replace(config, **changes))  # type: ignore[arg-type]

    return make


@pytest_asyncio.fixture
async def coordinator(
    make_coordinator: Callable[..., CommitCoordinator],
) -> AsyncIterator[CommitCoordinator]:
    coord = make_coordinator()
    await coord.open()
    try:
        yield coord
    finally:
        await coord.close()


@dataclass
class Served:
    coordinator: CommitCoordinator
    server: FlightServer

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.server.port}"

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@pytest_asyncio.fixture
async def served(coordinator: CommitCoordinator) -> AsyncIterator[Served]:
    """The real MetaHandler behind the shared grpc.aio ``serve()`` on loopback."""
    async with serve_handler(coordinator) as running:
        yield running


class serve_handler:
    """``async with serve_handler(coordinator, authenticate=...) as served``."""

    def __init__(
        self,
        coordinator: CommitCoordinator,
        authenticate: object = loopback_principal,
        handler: Callable[[CommitCoordinator], MetaHandler] = MetaHandler,
    ) -> None:
        self._coordinator = coordinator
        self._authenticate = authenticate
        self._handler = handler
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Served:
        started: asyncio.Future[FlightServer] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(
            serve(
                self._handler(self._coordinator),
                "127.0.0.1:0",
                authenticate=self._authenticate,  # type: ignore[arg-type]
                grace_ms=5_000,
                on_started=started.set_result,
                stop=self._stop,
            )
        )
        done, _ = await asyncio.wait(
            {started, self._task}, timeout=30, return_when=asyncio.FIRST_COMPLETED
        )
        if started not in done:
            raise RuntimeError(f"server did not start: {self._task}")
        return Served(self._coordinator, started.result())

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


@dataclass(frozen=True)
class Kit:
    """Shared constants and helpers (test modules cannot import conftest by name)."""

    episodes: TableRef = EPISODES
    schema: pa.Schema = SCHEMA
    file_schema: pa.Schema = FILE_SCHEMA
    make_batch: Callable[..., pa.RecordBatch] = make_batch
    serve_handler: type[serve_handler] = serve_handler


@pytest.fixture
def kit() -> Kit:
    return Kit()


@pytest.fixture(scope="module")
def dynalite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dynalite]:
    """One dynalite process per test module; every store gets its own table."""
    server = Dynalite(tmp_path_factory.mktemp("dynalite")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def dynamo_registry(
    dynalite: Dynalite, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[DynamoRegistry]:
    """An open DynamoDB registry in a table of its own on the module's dynalite."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dynalite")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dynalite")
    store = DynamoRegistry(
        f"reg_{uuid.uuid4().hex[:10]}", endpoint_url=dynalite.endpoint, region=dynalite.region
    )
    await store.open()
    try:
        yield store
    finally:
        await store.close()
