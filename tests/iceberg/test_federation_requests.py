"""A direct scan's requests to object storage: one GET for a small data file read whole.

Counted at a request-counting S3 proxy (tools/lake_testing/s3proxy.py) in
front of SeaweedFS, for a table pyiceberg wrote (its manifests record each
file's column sizes). A small file whose columns read make up most of it is
fetched in one GET after its HEAD (lake_iceberg.federation.reader.reads_whole);
a narrow projection of a wide file fetches the footer and its column chunk
only, as before. Both return pyiceberg's own rows. A manifest or manifest
list read once is not fetched again by a later scan of the replica
(lake_iceberg.federation.contents); the data files are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from lake_iceberg.federation.contents import ManifestBytes, ManifestLists
from tools.lake_testing.iceberg import SeaweedIceberg, in_process_federation
from tools.lake_testing.s3proxy import S3Proxy

pytestmark = [pytest.mark.iceberg, pytest.mark.s3]

NAMESPACE = "requests"
FILES = 3
ROWS = 400
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "payload", StringType(), required=False),
)


@pytest.fixture(scope="module")
def counted(iceberg_server: SeaweedIceberg) -> Iterator[tuple[S3Proxy, Any, Any]]:
    catalog = iceberg_server.catalog()
    catalog.create_namespace(NAMESPACE)
    table = catalog.create_table((NAMESPACE, "wide"), schema=SCHEMA)
    for part in range(FILES):
        ids = list(range(part * ROWS, (part + 1) * ROWS))
        table.append(
            pa.table(
                {"id": ids, "payload": [f"{i:0300d}" for i in ids]},  # distinct, incompressible-ish
                schema=SCHEMA.as_arrow(),
            )
        )
    proxy = S3Proxy(iceberg_server.endpoint).start()
    try:
        env = {"LAKE_ICEBERG_S3_ENDPOINT": proxy.endpoint}
        with in_process_federation(iceberg_server, NAMESPACE, env) as federation:
            yield proxy, federation, catalog.load_table((NAMESPACE, "wide"))
    finally:
        proxy.stop()


def _scan(proxy: S3Proxy, federation: Any, schema: pa.Schema) -> tuple[pa.Table, Counter[str]]:
    """The direct read of ``schema``'s columns, and the requests per data file by method."""
    pinned = federation.pinned(NAMESPACE, "wide", federation.plan(NAMESPACE, "wide").snapshot_id)
    proxy.paths.clear()
    batches = pinned.batches(schema, 1024)
    assert batches is not None  # a plain projection: read directly
    rows = pa.Table.from_batches(list(batches), schema)
    per_file: Counter[str] = Counter()
    for (method, path), count in proxy.paths.items():
        if path.endswith(".parquet"):
            per_file[method] += count
    return rows, per_file


def by_id(row: dict[str, Any]) -> int:
    return int(row["id"])


def test_a_small_file_read_whole_takes_one_get(counted: tuple[S3Proxy, Any, Any]) -> None:
    proxy, federation, table = counted
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    rows, per_file = _scan(proxy, federation, schema)
    expected = table.scan().to_arrow().to_pylist()
    assert sorted(rows.to_pylist(), key=by_id) == sorted(expected, key=by_id)
    assert per_file == Counter({"HEAD": FILES, "GET": FILES})


def test_a_narrow_projection_fetches_its_chunks_only(counted: tuple[S3Proxy, Any, Any]) -> None:
    proxy, federation, _ = counted
    rows, per_file = _scan(proxy, federation, pa.schema([("id", pa.int64())]))
    assert sorted(rows.column("id").to_pylist()) == list(range(FILES * ROWS))
    assert per_file == Counter({"HEAD": FILES, "GET": 2 * FILES})  # the footer, then the chunk


def _metadata_requests(proxy: S3Proxy) -> tuple[Counter[str], Counter[str]]:
    """Requests for the manifest list(s) and for manifests, by method."""
    lists: Counter[str] = Counter()
    manifests: Counter[str] = Counter()
    for (method, path), count in proxy.paths.items():
        name = path.rsplit("/", 1)[-1]
        if name.endswith(".avro"):
            (lists if name.startswith("snap-") else manifests)[method] += count
    return lists, manifests


def test_a_manifest_read_once_is_not_fetched_again(counted: tuple[S3Proxy, Any, Any]) -> None:
    proxy, federation, table = counted
    schema = pa.schema([("id", pa.int64()), ("payload", pa.string())])
    expected = sorted(table.scan().to_arrow().to_pylist(), key=by_id)
    federation.manifests = ManifestBytes()  # none kept yet
    federation.manifest_lists = ManifestLists()
    first, first_files = _scan(proxy, federation, schema)
    lists, manifests = _metadata_requests(proxy)
    assert lists["GET"] == 1
    assert manifests["GET"] == FILES  # one manifest per append
    assert len(federation.manifests) == FILES
    assert len(federation.manifest_lists) == 1
    again, again_files = _scan(proxy, federation, schema)
    lists, manifests = _metadata_requests(proxy)
    assert lists == Counter()  # the manifest list's manifests were kept
    assert manifests == Counter()  # every manifest came from the kept bytes
    assert again_files == first_files == Counter({"HEAD": FILES, "GET": FILES})
    assert sorted(again.to_pylist(), key=by_id) == sorted(first.to_pylist(), key=by_id) == expected
