"""Fixtures for lake-query: real Lance datasets and an in-process Query server.

``LocalCatalog`` plays Metasrv's catalog role for unit tests: it answers the
same conditional ``catalog_snapshot`` call over Lance datasets written in a
temporary directory (stamped with their incarnation, as Metasrv does) and
counts every call, so tests can prove that warm paths make none.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lance
import pyarrow as pa
import pytest

from lake_core import protocol
from lake_core.flight.server import FlightServer, serve
from lake_core.ids import new_operation_id
from lake_core.models import CatalogEntry, TableDescriptor, incarnation_metadata
from lake_core.names import TableRef
from lake_core.principal import DEV_PRINCIPAL, Principal
from lake_core.schemas import schema_to_base64
from lake_core.tickets import TicketKeyRing, TicketSealer
from lake_query.flightsql import QueryHandler
from lake_query.planning.catalog_cache import CatalogCache

EPISODES_ROWS = 20_000


@dataclass
class LocalCatalog:
    """An in-memory catalog authority over local Lance datasets."""

    root: Path
    entries: dict[TableRef, CatalogEntry] = field(default_factory=dict)
    generation: int = 1
    calls: int = 0
    fail: bool = False

    async def catalog_snapshot(self, generation: str | None) -> protocol.CatalogSnapshotResult:
        self.calls += 1
        await asyncio.sleep(0.001)  # a network round trip lets other tasks run
        if self.fail:
            raise ConnectionError("catalog source down")
        current = str(self.generation)
        if generation == current:
            return protocol.CatalogSnapshotResult(not_modified=True, generation=current)
        return protocol.CatalogSnapshotResult(
            not_modified=False, generation=current, tables=list(self.entries.values())
        )

    #: Also stamp a user metadata key whose value differs per table, the shape
    #: that makes DataFusion 54 fail reordered joins.
    conflicting_metadata: bool = False

    def location(self, ref: TableRef) -> str:
        return str(self.root / ref.namespace / f"{ref.name}.lance")

    def create(self, table: str, data: pa.Table) -> CatalogEntry:
        """Create (or recreate, as a new incarnation) a table holding ``data``."""
        ref = TableRef.parse(table)
        # Like Metasrv: a recreated table starts a fresh dataset (Lance
        # versions restart at 1) stamped with a new incarnation.
        shutil.rmtree(self.location(ref), ignore_errors=True)
        incarnation = new_operation_id()  # a UUIDv7, as Metasrv mints it
        metadata = incarnation_metadata(incarnation)
        if self.conflicting_metadata:
            metadata[b"owner"] = incarnation.encode()
        schema = data.schema.with_metadata(metadata)
        dataset = lance.write_dataset(
            data.replace_schema_metadata(schema.metadata), self.location(ref), schema=schema
        )
        return self._register(ref, incarnation, 1, int(dataset.version), data.schema)

    def append(self, table: str, data: pa.Table) -> CatalogEntry:
        ref = TableRef.parse(table)
        entry = self.entries[ref]
        dataset = lance.write_dataset(data, self.location(ref), mode="append")
        return self._register(
            ref,
            entry.descriptor.incarnation,
            entry.descriptor.version + 1,
            int(dataset.version),
            data.schema,
        )

    def drop(self, table: str) -> None:
        self.entries.pop(TableRef.parse(table))
        self.generation += 1

    def _register(
        self, ref: TableRef, incarnation: str, version: int, engine_version: int, schema: pa.Schema
    ) -> CatalogEntry:
        entry = CatalogEntry(
            table=ref,
            descriptor=TableDescriptor(
                location=self.location(ref),
                incarnation=incarnation,
                version=version,
                engine_version=engine_version,
            ),
            schema_ipc=schema_to_base64(schema.remove_metadata()),
        )
        self.entries[ref] = entry
        self.generation += 1
        return entry

    def resolve(self, ref: TableRef) -> CatalogEntry | None:
        return self.entries.get(ref)

    def refs(self) -> list[TableRef]:
        return sorted(self.entries, key=lambda r: (r.namespace, r.name))


def episodes(start: int, rows: int) -> pa.Table:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.table(
        {
            "episode_id": ids,
            "robot": pa.array([f"robot-{i % 7}" for i in range(start, start + rows)]),
            "duration_s": pa.array([i * 0.25 for i in range(start, start + rows)], pa.float64()),
            "ok": pa.array([i % 3 != 0 for i in range(start, start + rows)]),
        }
    )


def rewards(start: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "episode_id": pa.array(range(start, start + rows), pa.int64()),
            "reward": pa.array([float(i % 100) for i in range(start, start + rows)], pa.float32()),
        }
    )


@pytest.fixture
def catalog(tmp_path: Path) -> LocalCatalog:
    """``robots.episodes`` (20,000 rows), ``robots.rewards`` and ``secret.plans``."""
    local = LocalCatalog(tmp_path / "tables")
    local.create("robots.episodes", episodes(0, EPISODES_ROWS))
    local.create("robots.rewards", rewards(0, EPISODES_ROWS))
    local.create("secret.plans", pa.table({"plan": pa.array(["a", "b"])}))
    return local


#: A caller granted only the ``robots`` namespace.
ROBOTS_ONLY = Principal(
    principal_id="robots-user", tenant_id="acme", role="user", namespaces=frozenset({"robots"})
)


@dataclass
class RunningQuery:
    """An in-process Query server on a background event loop."""

    addr: str
    handler: QueryHandler
    cache: CatalogCache
    loop: asyncio.AbstractEventLoop

    @property
    def url(self) -> str:
        return f"grpc://{self.addr}"

    def call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)  # type: ignore[arg-type]


def start_server(
    source: object,
    *,
    principal: Principal = DEV_PRINCIPAL,
    appends: object = None,
    ring: TicketKeyRing | None = None,
    refresh_s: float = 3600.0,
) -> tuple[RunningQuery, threading.Thread, asyncio.Event]:
    ring = ring or TicketKeyRing.ephemeral()
    ready: dict[str, object] = {}
    started = threading.Event()
    loop = asyncio.new_event_loop()

    async def main() -> None:
        stop = asyncio.Event()
        cache = CatalogCache(source, refresh_s)  # type: ignore[arg-type]
        await cache.start()
        handler = QueryHandler(
            cache=cache,
            sealer=TicketSealer(ring, "lake-query-test", 300),
            handle_sealer=TicketSealer(ring, "lake-query-test/prepared", 3600),
            appends=appends,  # type: ignore[arg-type]
        )

        def on_started(server: FlightServer) -> None:
            ready.update(port=server.port, handler=handler, cache=cache, stop=stop)
            started.set()

        try:
            await serve(
                handler,
                "127.0.0.1:0",
                authenticate=lambda *_: principal,
                on_started=on_started,
                stop=stop,
                grace_ms=2000,
            )
        finally:
            await cache.close()
            handler.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise TimeoutError("in-process Query server did not start")
    running = RunningQuery(
        addr=f"127.0.0.1:{ready['port']}",
        handler=ready["handler"],  # type: ignore[arg-type]
        cache=ready["cache"],  # type: ignore[arg-type]
        loop=loop,
    )
    return running, thread, ready["stop"]  # type: ignore[return-value]


@pytest.fixture
def query_server(catalog: LocalCatalog) -> Iterator[RunningQuery]:
    running, thread, stop = start_server(catalog)
    try:
        yield running
    finally:
        running.loop.call_soon_threadsafe(stop.set)
        thread.join(30)
