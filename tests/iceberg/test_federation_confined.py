"""A catalog cannot make Query open files outside the configured warehouse.

A real ``lake query`` federates a scripted catalog (a tiny HTTP server) that
answers with the metadata of a real table SeaweedFS's catalog holds, with one
location changed: the metadata file, the snapshot's manifest list, one
manifest it lists or one data file a manifest names points either at a local
file of the replica or at another bucket of the same store (one Query's
credentials can read). Query reads the table's objects through a counting
proxy (tools/lake_testing/s3proxy.py).

Each is refused with ``Unavailable`` naming the table (the catalog's fault,
never the caller's) and neither path nor bucket, whichever way the statement
is read (the plug-in's own reader, or DataFusion over iceberg-rust), and
nothing is read: the local file is a FIFO whose writer would notice a reader,
and the proxy sees no request for the other bucket. The same table with its
own locations reads as it should.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from datafusion import SessionContext
from datafusion.catalog import Table
from pyiceberg.manifest import (
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)

import lake_sdk
from lake_core.errors import Unavailable
from lake_iceberg.federation import FederationConfig, IcebergFederation
from tools.lake_testing.iceberg import (
    SeaweedIceberg,
    federation_env,
    proxied_query,
    write_episodes,
)
from tools.lake_testing.rest_catalog import FakeCatalog, documents, serving
from tools.lake_testing.s3proxy import S3Proxy
from tools.lake_testing.servers import LakeProcess

pytestmark = [pytest.mark.iceberg, pytest.mark.s3, pytest.mark.slow]

NAMESPACE = "confined"
#: Another bucket of the same store: Query's own credentials could read it.
OTHER = "elsewhere"
PATHS = {
    "direct": "SELECT episode_id, robot_id, reward FROM iceberg.confined.{table}",
    "datafusion": "SELECT robot_id, count(*) AS n FROM iceberg.confined.{table} GROUP BY robot_id",
}


class _Fifo:
    """A local "file" that serves ``content`` once, and records whether anyone opened it."""

    def __init__(self, path: Path, content: bytes) -> None:
        os.mkfifo(path)
        self.path = path
        self.opened = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, args=(content,), daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return self.path.as_uri()

    def _serve(self, content: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY)  # blocks until a reader opens the FIFO
        if not self._closing:
            self.opened.set()
        with contextlib.suppress(OSError):
            os.write(fd, content)
        os.close(fd)

    def close(self) -> None:
        """Release the writer if nobody opened the FIFO."""
        self._closing = True
        if not self.opened.is_set():
            reader = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._thread.join(5)
            os.close(reader)


@dataclass
class Confined:
    server: SeaweedIceberg
    proxy: S3Proxy
    query: LakeProcess
    catalog: FakeCatalog
    documents: dict[str, bytes]
    table: Any
    root: Path
    fifos: list[_Fifo]

    def serve(self, name: str, metadata_location: str, metadata: dict[str, Any]) -> None:
        document = {"metadata-location": metadata_location, "metadata": metadata, "config": {}}
        self.documents[name] = json.dumps(document).encode()

    def fifo(self, name: str, content: bytes) -> _Fifo:
        fifo = _Fifo(self.root / name, content)
        self.fifos.append(fifo)
        return fifo

    def read(self, location: str) -> bytes:
        with self.table.io.new_input(location).open() as stream:
            return bytes(stream.read())

    def copy_elsewhere(self, location: str, key: str) -> str:
        self.server.client().put_object(Bucket=OTHER, Key=key, Body=self.read(location))
        return f"s3://{OTHER}/{key}"

    def other_requests(self) -> int:
        return sum(n for (_, path), n in self.proxy.paths.items() if path.startswith(f"/{OTHER}"))


@pytest.fixture(scope="module")
def confined(
    iceberg_server: SeaweedIceberg, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Confined]:
    root = tmp_path_factory.mktemp("federation-confined")
    table = write_episodes(iceberg_server.catalog(), NAMESPACE, "episodes")
    iceberg_server.create_bucket(OTHER)
    tables: dict[str, bytes] = {}
    fifos: list[_Fifo] = []
    with serving(documents(tables)) as catalog:
        env = {
            "LAKE_ICEBERG_REST_ENDPOINT": catalog.endpoint,
            "LAKE_ICEBERG_REST_CREDENTIAL": "",  # the scripted catalog asks for none
        }
        try:
            with proxied_query(iceberg_server, NAMESPACE, root, env) as (proxy, query):
                yield Confined(iceberg_server, proxy, query, catalog, tables, table, root, fifos)
        finally:
            for fifo in fifos:
                fifo.close()


def _metadata(table: Any) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        table.metadata.model_dump_json(by_alias=True, exclude_none=True)
    )
    return document


def _with_manifest_list(table: Any, manifest_list: str) -> dict[str, Any]:
    metadata = _metadata(table)
    for snapshot in metadata["snapshots"]:
        if snapshot["snapshot-id"] == table.metadata.current_snapshot_id:
            snapshot["manifest-list"] = manifest_list
    return metadata


def _write_list(table: Any, location: str, manifests: list[ManifestFile]) -> None:
    snapshot = table.current_snapshot()
    with write_manifest_list(
        table.metadata.format_version,
        table.io.new_output(location),
        snapshot.snapshot_id,
        snapshot.parent_snapshot_id,
        snapshot.sequence_number,
        "deflate",
    ) as writer:
        writer.add_manifests(manifests)


def _listing(c: Confined, name: str, first_manifest: Callable[[ManifestFile], str]) -> str:
    """A manifest list in the table's own location whose first manifest is moved."""
    manifests = c.table.current_snapshot().manifests(c.table.io)
    moved = copy.copy(manifests[0])
    moved._data = [first_manifest(manifests[0]), *manifests[0]._data[1:]]  # read-only fields
    location = f"{c.table.location()}/metadata/hostile-{name}-list.avro"
    _write_list(c.table, location, [moved, *manifests[1:]])
    return location


def _manifest_naming(c: Confined, name: str, data_file: Callable[[str], str]) -> str:
    """A manifest list in the table's location whose first manifest names a moved data file."""
    table = c.table
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io)
    entries = manifests[0].fetch_manifest_entry(table.io, discard_deleted=True)
    path = f"{table.location()}/metadata/hostile-{name}-manifest.avro"
    with write_manifest(
        table.metadata.format_version,
        table.spec(),
        table.schema(),
        table.io.new_output(path),
        snapshot.snapshot_id,
        "deflate",
    ) as writer:
        for entry in entries:
            moved = copy.copy(entry.data_file)
            fields = entry.data_file._data  # the path is a read-only field
            moved._data = [fields[0], data_file(entry.data_file.file_path), *fields[2:]]
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED,
                    snapshot_id=snapshot.snapshot_id,
                    data_file=moved,
                )
            )
    location = f"{table.location()}/metadata/hostile-{name}-list.avro"
    _write_list(table, location, [writer.to_manifest_file(), *manifests[1:]])
    return location


def _local(c: Confined, name: str) -> Callable[[str], str]:
    return lambda location: c.fifo(f"{name}-{location.rsplit('/', 1)[-1]}", c.read(location)).uri


def _other(c: Confined, name: str) -> Callable[[str], str]:
    return lambda location: c.copy_elsewhere(location, f"{name}/{location.rsplit('/', 1)[-1]}")


def _hostile(c: Confined, case: str, name: str) -> None:
    """Serve table ``name``: the real table with the one location ``case`` moves."""
    table = c.table
    where, _, what = case.partition("-")
    move = _local(c, name) if where == "local" else _other(c, name)
    if what == "metadata":
        c.serve(name, move(table.metadata_location), _metadata(table))
    elif what == "manifest_list":
        listing = move(table.current_snapshot().manifest_list)
        c.serve(name, table.metadata_location, _with_manifest_list(table, listing))
    elif what == "manifest":
        listing = _listing(c, name, lambda manifest: move(manifest.manifest_path))
        c.serve(name, table.metadata_location, _with_manifest_list(table, listing))
    else:
        listing = _manifest_naming(c, name, move)
        c.serve(name, table.metadata_location, _with_manifest_list(table, listing))


CASES = [
    f"{where}-{what}"
    for where in ("local", "other")
    for what in ("metadata", "manifest_list", "manifest", "data")
]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", CASES)
def test_a_location_outside_the_warehouse_is_refused_unread(
    confined: Confined, case: str, path: str
) -> None:
    name = f"{case}_{path}".replace("-", "_")
    _hostile(confined, case, name)
    before = confined.other_requests()
    with lake_sdk.Client(confined.query.url) as sdk, pytest.raises(Unavailable) as caught:
        sdk.query_table(PATHS[path].format(table=name))
    message = str(caught.value)
    assert "outside the configured location" in message, message
    assert f"iceberg.{NAMESPACE}.{name}" in message, message
    for leak in ("s3://", "file:", OTHER, str(confined.root), confined.server.warehouse_bucket):
        assert leak not in message, message
    assert confined.other_requests() == before  # the other bucket was never asked
    assert not any(fifo.opened.is_set() for fifo in confined.fifos)  # no local file opened


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_tables_own_locations_still_read(confined: Confined, path: str) -> None:
    name = f"own_{path}"
    confined.serve(name, confined.table.metadata_location, _metadata(confined.table))
    with lake_sdk.Client(confined.query.url) as sdk:
        got = sdk.query_table(PATHS[path].format(table=name))
    assert got.num_rows == (60 if path == "direct" else 3)


def _in_process(c: Confined, s3_endpoint: str | None) -> IcebergFederation:
    """A federation of the scripted catalog reading with Query's identity (the AWS variables)."""
    env = {
        **federation_env(c.server, NAMESPACE),
        "LAKE_ICEBERG_REST_ENDPOINT": c.catalog.endpoint,
        "LAKE_ICEBERG_REST_CREDENTIAL": "",
        "LAKE_ICEBERG_S3_ENDPOINT": s3_endpoint or "",
        "LAKE_ICEBERG_S3_REGION": c.server.region if s3_endpoint else "",
        "LAKE_ICEBERG_S3_TIMEOUT_MS": "2000",
    }
    config = FederationConfig.from_env(env)
    assert config is not None
    identity = {
        "s3.access-key-id": c.server.access_key,
        "s3.secret-access-key": c.server.secret_key,
    }
    federation = IcebergFederation(config, file_io=identity)
    federation.start()
    return federation


def _scan(federation: IcebergFederation, name: str, path: str) -> int:
    table = federation.plan(NAMESPACE, name)
    if path == "direct":
        schema = pa.schema([("episode_id", pa.int64())])
        batches = table.batches(schema, 1024)
        assert batches is not None
        return sum(batch.num_rows for batch in batches)
    context = SessionContext()
    context.register_table("t", Table(table.provider()))
    return context.sql("SELECT count(*) AS n FROM t").to_arrow_table()["n"][0].as_py()


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_catalog_cannot_route_querys_requests(confined: Confined, path: str) -> None:
    """A proxy, a role or an endpoint in the table config never carries Query's identity."""
    elsewhere = S3Proxy(confined.server.endpoint).start()
    try:
        config = {
            "s3.proxy-uri": elsewhere.endpoint,
            "s3.endpoint": elsewhere.endpoint,
            "s3.role-arn": "arn:aws:iam::123456789012:role/catalog-chosen",
            "s3.assume-role.arn": "arn:aws:iam::123456789012:role/catalog-chosen",
        }
        for name, endpoint in (
            (f"routed_{path}", confined.proxy.endpoint),
            (f"unset_{path}", None),
        ):
            document = {
                "metadata-location": confined.table.metadata_location,
                "metadata": _metadata(confined.table),
                "config": config,
            }
            confined.documents[name] = json.dumps(document).encode()
            federation = _in_process(confined, endpoint)
            try:
                if endpoint is not None:  # the operator's endpoint, and only it, is asked
                    assert _scan(federation, name, path) == 60
                else:  # none configured: AWS's own (unreachable here), never the catalog's
                    with pytest.raises(Unavailable):
                        _scan(federation, name, path)
            finally:
                federation.close()
        assert elsewhere.total == 0
    finally:
        elsewhere.stop()


def test_vended_credentials_may_bring_their_endpoint(confined: Confined) -> None:
    """With its own credentials the catalog decides where they are used: Query's are not sent."""
    name = "vended"
    config = {
        "s3.endpoint": confined.proxy.endpoint,
        "s3.access-key-id": confined.server.access_key,
        "s3.secret-access-key": confined.server.secret_key,
        "s3.path-style-access": "true",
    }
    document = {
        "metadata-location": confined.table.metadata_location,
        "metadata": _metadata(confined.table),
        "config": config,
    }
    confined.documents[name] = json.dumps(document).encode()
    federation = _in_process(confined, None)
    before = confined.proxy.total
    try:
        assert _scan(federation, name, "direct") == 60
    finally:
        federation.close()
    assert confined.proxy.total > before
